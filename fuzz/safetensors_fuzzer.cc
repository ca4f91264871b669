// Fuzz target: the safetensors reader (SafetensorsFile::FromBytes) and the BERT weight loader on
// top of it. Any bytes must give either an error or a file whose every tensor lies inside the
// data section with shape x dtype size == byte range, readable without touching other memory.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "fuzz/fuzz_check.h"

namespace {

// The tiny model's shapes (fuzz/tiny_model/config.json), so a mutated copy of its weights file
// reaches LoadBertWeights' name and shape checks.
attn::BertConfig TinyConfig() {
  attn::BertConfig config;
  config.vocab_size = 113;
  config.hidden_size = 8;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 2;
  config.intermediate_size = 16;
  config.max_position_embeddings = 16;
  return config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = attn::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!file.ok()) return 0;

  uint64_t header_len = 0;  // a valid file has >= 8 bytes; little-endian like this machine
  std::memcpy(&header_len, data, sizeof(header_len));
  const uint64_t data_size = size - 8 - header_len;
  const attn::TensorInfo* previous = nullptr;
  for (const attn::TensorInfo& info : (*file)->tensors()) {
    FUZZ_CHECK(info.begin <= info.end && info.end <= data_size, "'%s' [%llu, %llu) outside %llu",
               info.name.c_str(), (unsigned long long)info.begin, (unsigned long long)info.end,
               (unsigned long long)data_size);
    uint64_t numel = 1;
    for (int64_t dim : info.shape) numel *= static_cast<uint64_t>(dim);
    FUZZ_CHECK(numel * attn::DTypeSize(info.dtype) == info.end - info.begin, "'%s' size mismatch",
               info.name.c_str());
    FUZZ_CHECK(previous == nullptr || previous->name < info.name, "tensors not sorted by name");
    previous = &info;

    const std::string_view raw = (*file)->RawBytes(info);
    FUZZ_CHECK(raw.size() == info.end - info.begin, "RawBytes size");
    FUZZ_CHECK((*file)->Find(info.name) == &info, "Find('%s') does not return the listed tensor",
               info.name.c_str());
    // Reads every byte through ASan's eyes; non-float dtypes must be refused, not misread.
    auto values = (*file)->ReadFloat32(info.name);
    const bool is_float = info.dtype == attn::DType::kF32 || info.dtype == attn::DType::kF16 ||
                          info.dtype == attn::DType::kBF16 || info.dtype == attn::DType::kF64;
    FUZZ_CHECK(values.ok() == is_float, "ReadFloat32('%s'): %s", info.name.c_str(),
               values.status().ToString().c_str());
    if (values.ok()) {
      FUZZ_CHECK(static_cast<uint64_t>(values->numel()) == numel, "ReadFloat32('%s') numel",
                 info.name.c_str());
    }
  }

  // Non-overlap: with tensors sorted by begin, each non-empty range starts at or after the
  // furthest end seen so far.
  std::vector<const attn::TensorInfo*> by_begin;
  for (const attn::TensorInfo& info : (*file)->tensors()) {
    if (info.begin != info.end) by_begin.push_back(&info);
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  uint64_t previous_end = 0;
  for (const attn::TensorInfo* info : by_begin) {
    FUZZ_CHECK(info->begin >= previous_end, "'%s' overlaps an earlier tensor", info->name.c_str());
    previous_end = info->end;
  }

  // The weight loader: missing/unknown/wrong-shaped tensors are errors, never crashes.
  (void)attn::LoadBertWeights(**file, TinyConfig());
  return 0;
}
