#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/durable_file.h"
#include "engine/half.h"
#include "engine/json_depth.h"
#include "engine/log.h"
#include "nlohmann/json.hpp"

// Tensor data is little-endian on disk and copied straight into host floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors reader assumes little-endian");

namespace attn {
namespace {

using Json = nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  int size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

const DTypeEntry& Entry(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[1];  // unreachable: every enumerator is in the table
}

// JSON integers arrive as signed or unsigned depending on their sign; floats are not integers.
bool AsNonNegativeInt(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

// Element-wise conversion from possibly unaligned source bytes.
template <typename Src, typename Convert>
void ConvertElements(const char* src, int64_t n, float* dst, Convert convert) {
  for (int64_t i = 0; i < n; ++i) {
    Src v;
    std::memcpy(&v, src + i * sizeof(Src), sizeof(Src));
    dst[i] = convert(v);
  }
}

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

bool ParseDType(std::string_view text, DType* dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == text) {
      *dtype = e.dtype;
      return true;
    }
  }
  return false;
}

std::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

int DTypeSize(DType dtype) { return Entry(dtype).size; }

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrFormat("%s: cannot open: %s", path, ErrnoText(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrFormat("%s: cannot stat: %s", path, ErrnoText(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("%s: not a regular file", path));
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_name_ = path;
  file->file_size_ = static_cast<uint64_t>(st.st_size);
  // mmap rejects length 0; such a file is invalid anyway and Parse() says why.
  if (file->file_size_ > 0) {
    void* p = mmap(nullptr, file->file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::Status(absl::ErrnoToStatusCode(err),
                          absl::StrFormat("%s: cannot mmap: %s", path, ErrnoText(err)));
    }
    file->mapping_ = p;
    file->mapping_size_ = file->file_size_;
    file->file_data_ = static_cast<const char*>(p);
  }
  ::close(fd);  // the mapping keeps its own reference to the file

  absl::Status status = file->Parse();
  if (!status.ok()) return status;
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(
    std::string bytes, std::string source_name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_name_ = std::move(source_name);
  file->owned_bytes_ = std::move(bytes);
  file->file_data_ = file->owned_bytes_.data();
  file->file_size_ = file->owned_bytes_.size();
  absl::Status status = file->Parse();
  if (!status.ok()) return status;
  return file;
}

absl::Status SafetensorsFile::Parse() {
  auto fail = [this](const std::string& message) {
    return absl::InvalidArgumentError(absl::StrCat(source_name_, ": ", message));
  };
  auto tensor_fail = [this](const std::string& name, const std::string& message) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor '%s': %s", source_name_, name, message));
  };

  if (file_size_ < 8) {
    return fail(absl::StrFormat(
        "file is %d bytes, shorter than the 8-byte header length that starts a safetensors file",
        file_size_));
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) {
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(file_data_[i])) << (8 * i);
  }
  if (header_len > kMaxHeaderBytes) {
    return fail(absl::StrFormat("header length %d exceeds the limit of %d bytes", header_len,
                                kMaxHeaderBytes));
  }
  if (header_len > file_size_ - 8) {
    return fail(absl::StrFormat(
        "header length %d runs past the end of the file (8 + %d > %d bytes); truncated file?",
        header_len, header_len, file_size_));
  }
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size_ - data_start_;

  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor name makes the file
  // ambiguous, so the callback records it for rejection.
  std::string duplicate;
  std::set<std::string> top_keys;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !top_keys.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  if (JsonNestsDeeperThan(std::string_view(file_data_ + 8, header_len))) {
    return fail(absl::StrFormat("header nests deeper than %d levels", kMaxJsonDepth));
  }
  Json header;
  try {
    header = Json::parse(file_data_ + 8, file_data_ + data_start_, on_event);
  } catch (const Json::exception& e) {
    return fail(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return fail(absl::StrCat("header must be a JSON object, found ", header.type_name()));
  }
  if (!duplicate.empty()) {
    return fail(absl::StrFormat("header lists '%s' more than once", duplicate));
  }

  std::vector<TensorInfo> tensors;
  tensors.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return fail(
            absl::StrCat("__metadata__ must be an object of strings, found ", entry.type_name()));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return fail(absl::StrFormat("__metadata__ '%s' must be a string, found %s", key,
                                      value.type_name()));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }

    if (!entry.is_object()) {
      return tensor_fail(name, absl::StrCat("entry must be an object, found ", entry.type_name()));
    }
    TensorInfo info;
    info.name = name;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return tensor_fail(name, "missing or non-string \"dtype\"");
    }
    const std::string dtype_text = dtype_it->get<std::string>();
    if (!ParseDType(dtype_text, &info.dtype)) {
      return tensor_fail(
          name, absl::StrFormat("unknown dtype '%s' (expected one of F64, F32, F16, BF16, I64, "
                                "I32, I16, I8, U8, BOOL)",
                                dtype_text));
    }

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return tensor_fail(name, "missing or non-array \"shape\"");
    }
    // Count elements in unsigned 64-bit with overflow checks: a hostile shape must not wrap
    // around to a product that happens to match the byte range.
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < shape_it->size(); ++i) {
      const Json& dim_json = (*shape_it)[i];
      uint64_t dim = 0;
      if (!AsNonNegativeInt(dim_json, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
        return tensor_fail(name, absl::StrFormat("shape[%d] is %s; dimensions must be "
                                                 "non-negative integers",
                                                 i, dim_json.dump()));
      }
      info.shape.push_back(static_cast<int64_t>(dim));
      overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    }
    const int elem_size = DTypeSize(info.dtype);
    uint64_t needed = 0;
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &needed);

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !AsNonNegativeInt((*offsets_it)[0], &info.begin) ||
        !AsNonNegativeInt((*offsets_it)[1], &info.end)) {
      return tensor_fail(name, absl::StrCat("\"data_offsets\" must be [begin, end] with "
                                            "non-negative integers, found ",
                                            offsets_it == entry.end() ? std::string("nothing")
                                                                      : offsets_it->dump()));
    }
    if (info.begin > info.end) {
      return tensor_fail(
          name, absl::StrFormat("data_offsets [%d, %d] have begin > end", info.begin, info.end));
    }
    if (info.end > data_size) {
      return tensor_fail(name, absl::StrFormat("data_offsets [%d, %d] run past the end of the data "
                                               "section (%d bytes)",
                                               info.begin, info.end, data_size));
    }
    if (overflow) {
      return tensor_fail(name, absl::StrFormat("shape %s x %s overflows 64-bit byte counts",
                                               ShapeToString(info.shape), dtype_text));
    }
    if (needed != info.end - info.begin) {
      return tensor_fail(name, absl::StrFormat("shape %s x %s needs %d bytes but data_offsets "
                                               "span %d",
                                               ShapeToString(info.shape), dtype_text, needed,
                                               info.end - info.begin));
    }
    tensors.push_back(std::move(info));
  }

  // Sort by range and compare each with the furthest end seen so far; empty ranges own no bytes
  // and cannot overlap anything.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const TensorInfo& t : tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (furthest != nullptr && t->begin < furthest->end) {
      return tensor_fail(
          t->name,
          absl::StrFormat("data_offsets [%d, %d] overlap tensor '%s' at [%d, %d]", t->begin, t->end,
                          furthest->name, furthest->begin, furthest->end));
    }
    if (furthest == nullptr || t->end > furthest->end) furthest = t;
  }

  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  tensors_ = std::move(tensors);
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

std::string_view SafetensorsFile::RawBytes(const TensorInfo& info) const {
  return std::string_view(file_data_ + data_start_ + info.begin, info.end - info.begin);
}

absl::StatusOr<Tensor> SafetensorsFile::ReadFloat32(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%s: no tensor named '%s'", source_name_, name));
  }
  // Validated in Parse(): the range holds exactly numel elements of the dtype.
  const int64_t n = static_cast<int64_t>((info->end - info->begin) /
                                         static_cast<uint64_t>(DTypeSize(info->dtype)));
  const char* src = file_data_ + data_start_ + info->begin;
  FloatBuffer values(static_cast<size_t>(n));
  switch (info->dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(values.data(), src, static_cast<size_t>(n) * sizeof(float));
      break;
    case DType::kF16:
      ConvertElements<uint16_t>(src, n, values.data(), HalfBitsToFloat);
      break;
    case DType::kBF16:
      ConvertElements<uint16_t>(src, n, values.data(), BFloat16BitsToFloat);
      break;
    case DType::kF64:
      ConvertElements<double>(src, n, values.data(),
                              [](double d) { return static_cast<float>(d); });
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: tensor '%s': dtype %s cannot be read as float32 (expected F32, "
                          "F16, BF16 or F64)",
                          source_name_, name, DTypeName(info->dtype)));
  }
  return Tensor(info->shape, std::move(values));
}

namespace {

// Builds the 8-byte length prefix plus the space-padded JSON header; data_offsets are
// contiguous in the given order so the data section is the tensors' bytes concatenated.
absl::StatusOr<std::string> BuildHeader(const std::vector<NamedTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    if (t.tensor == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor '%s' is null", t.name));
    }
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError("'__metadata__' is reserved and cannot name a tensor");
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor '%s' given twice", t.name));
    }
    const std::vector<int64_t>& shape = t.tensor->shape();
    for (int64_t d : shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor '%s': shape %s has a negative dimension", t.name, ShapeToString(shape)));
      }
    }
    // A default-constructed Tensor has shape [] (one element) but no values.
    if (Tensor::NumElements(shape) != t.tensor->numel()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor '%s': shape %s does not match its %d values", t.name,
                          ShapeToString(shape), t.tensor->numel()));
    }
    const uint64_t bytes = static_cast<uint64_t>(t.tensor->numel()) * sizeof(float);
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = "F32";
    entry["shape"] = shape;
    entry["data_offsets"] = OrderedJson::array({offset, offset + bytes});
    header[t.name] = std::move(entry);
    offset += bytes;
  }
  std::string json_text;
  try {
    json_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() throws on names or metadata that are not valid UTF-8.
    return absl::InvalidArgumentError(absl::StrCat("cannot encode header: ", e.what()));
  }
  // Padding keeps the data section 8-byte aligned inside the file.
  json_text.append((8 - json_text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t len = json_text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xffu);
  out += json_text;
  return out;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = BuildHeader(tensors, metadata);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  }
  auto io_error = [&path](const char* what, int err) {
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrFormat("%s: %s failed: %s", path, what, ErrnoText(err)));
  };
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("open", errno);
  // Tensors are written straight from their buffers, so a checkpoint never needs a second
  // in-memory copy of the weights.
  int err = WriteAll(fd, header->data(), header->size());
  for (size_t i = 0; err == 0 && i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i].tensor;
    err = WriteAll(fd, reinterpret_cast<const char*>(t.data()),
                   static_cast<size_t>(t.numel()) * sizeof(float));
  }
  if (err != 0) {
    ::close(fd);
    return io_error("write", err);
  }
  if (::fsync(fd) != 0) {
    err = errno;
    ::close(fd);
    return io_error("fsync", err);
  }
  if (::close(fd) != 0) return io_error("close", errno);
  return absl::OkStatus();
}

std::string SerializeSafetensors(const std::vector<NamedTensor>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = BuildHeader(tensors, metadata);
  if (!header.ok()) {
    // The signature has no error channel; an empty string is never a valid file, so a reader
    // rejects it rather than loading a wrong model.
    Log(LogLevel::kError, "SerializeSafetensors: %s", header.status().message());
    return std::string();
  }
  std::string out = *std::move(header);
  for (const NamedTensor& t : tensors) {
    out.append(reinterpret_cast<const char*>(t.tensor->data()),
               static_cast<size_t>(t.tensor->numel()) * sizeof(float));
  }
  return out;
}

}  // namespace attn
