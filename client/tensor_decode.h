// Decoding of attnserve.v1.Tensor ({shape, dtype, little-endian bytes}) into float32 values.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/encoder.pb.h"

namespace attn::client {

// A dense row-major float32 tensor.
struct DecodedTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // prod(shape) values

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[i]; }
  int64_t size() const { return static_cast<int64_t>(values.size()); }
};

// Decodes FLOAT32 (and DTYPE_UNSPECIFIED, which means FLOAT32), FLOAT16 (IEEE 754 half,
// including subnormals, infinities and NaN) and BFLOAT16. Fails with INVALID_ARGUMENT on a
// negative dimension, an element count that overflows, an unknown dtype, or when the byte size
// is not prod(shape) * dtype size. An empty shape is a scalar (one value), as prod([]) = 1.
absl::StatusOr<DecodedTensor> DecodeTensor(const attnserve::v1::Tensor& tensor);

// Bit-level conversions, exposed for tests.
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);

// Size in bytes of one element of `dtype`, or 0 for an unknown value.
int DTypeSize(attnserve::v1::DType dtype);

}  // namespace attn::client
