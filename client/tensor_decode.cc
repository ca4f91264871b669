#include "client/tensor_decode.h"

#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Assembles little-endian values byte by byte so decoding does not depend on host order.
uint16_t LoadU16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
uint32_t LoadU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {
    // Inf or NaN: keep the payload (shifted into float's 23-bit mantissa).
    return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);  // +-0
    // Subnormal half (mantissa * 2^-24): normalise it, every half subnormal is a normal float.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    mantissa &= 0x3FFu;
    const uint32_t float_exponent = static_cast<uint32_t>(127 - 15 - e);
    return BitsToFloat(sign | (float_exponent << 23) | (mantissa << 13));
  }
  return BitsToFloat(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

float BFloat16ToFloat(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

int DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

absl::StatusOr<DecodedTensor> DecodeTensor(const v1::Tensor& tensor) {
  const int elem_size = DTypeSize(tensor.dtype());
  if (elem_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor has unknown dtype %d", static_cast<int>(tensor.dtype())));
  }
  DecodedTensor out;
  out.shape.assign(tensor.shape().begin(), tensor.shape().end());
  const std::string shape_text = absl::StrCat("[", absl::StrJoin(out.shape, ", "), "]");
  // Bound the element count by what the data could possibly hold, so a hostile shape can
  // neither overflow int64 nor make us allocate more than the message carries.
  const uint64_t limit = tensor.data().size() / elem_size + 1;
  uint64_t count = 1;
  for (int64_t d : out.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor shape %s has a negative dimension", shape_text));
    }
    if (d != 0 && count > limit / static_cast<uint64_t>(d)) {
      count = limit + 1;  // larger than the data can hold; reported below
      continue;
    }
    count *= static_cast<uint64_t>(d);
  }
  if (count > limit || count * elem_size != tensor.data().size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor of shape %s and dtype %s needs %s bytes, got %d", shape_text,
        v1::DType_Name(tensor.dtype()),
        count > limit ? std::string("more than ") + std::to_string(tensor.data().size())
                      : std::to_string(count * elem_size),
        tensor.data().size()));
  }
  out.values.resize(count);
  const auto* p = reinterpret_cast<const unsigned char*>(tensor.data().data());
  switch (tensor.dtype()) {
    case v1::FLOAT16:
      for (uint64_t i = 0; i < count; ++i) out.values[i] = HalfToFloat(LoadU16(p + 2 * i));
      break;
    case v1::BFLOAT16:
      for (uint64_t i = 0; i < count; ++i) out.values[i] = BFloat16ToFloat(LoadU16(p + 2 * i));
      break;
    default:
      for (uint64_t i = 0; i < count; ++i) out.values[i] = BitsToFloat(LoadU32(p + 4 * i));
      break;
  }
  return out;
}

}  // namespace attn::client
