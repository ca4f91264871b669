// safetensors reader (and a small fp32 writer for checkpoints and tests).
//
// File format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the data section.
//
// Open() validates everything before any tensor byte is read: header length bound (and within
// the file), JSON parse, known dtype, shape x dtype size == byte range, ranges inside the data
// section and non-overlapping. The file is mapped read-only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace attn {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32" -> kF32 etc.; false if unknown.
bool ParseDType(std::string_view text, DType* dtype);
std::string_view DTypeName(DType dtype);
int DTypeSize(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Largest header accepted (the JSON part); real headers are a few hundred KiB at most.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // Maps `path` read-only and validates it. Errors name the file and the offending tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Same validation over bytes in memory (tests, fuzzing). `source_name` is used in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(
      std::string bytes, std::string source_name = "<memory>");

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source_name() const { return source_name_; }

  // Converts F32/F16/BF16/F64 to fp32. Other dtypes -> InvalidArgument naming the tensor.
  absl::StatusOr<Tensor> ReadFloat32(std::string_view name) const;
  // The tensor's raw little-endian bytes.
  std::string_view RawBytes(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string source_name_;
  std::string owned_bytes_;  // FromBytes()
  void* mapping_ = nullptr;  // Open()
  size_t mapping_size_ = 0;
  const char* file_data_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct NamedTensor {
  std::string name;
  const Tensor* tensor;
};

// Writes F32 tensors (names must be unique) with optional string metadata. Writes to `path`
// directly; callers that need atomicity write to a temporary name and rename.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// Same bytes, returned in memory.
std::string SerializeSafetensors(const std::vector<NamedTensor>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace attn
