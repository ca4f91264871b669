#include "engine/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <stdexcept>

#include "absl/strings/str_join.h"

namespace attn {

namespace {
thread_local bool huge_pages = false;
}  // namespace

ScopedHugePages::ScopedHugePages() : previous_(huge_pages) { huge_pages = true; }
ScopedHugePages::~ScopedHugePages() { huge_pages = previous_; }

void* AllocateAligned(std::size_t bytes, std::size_t alignment) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  if (huge_pages && bytes >= 2 * kHugePage) {
    bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, bytes);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: 4 KB pages still work if refused
    return p;
  }
  bytes = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, bytes == 0 ? alignment : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

int64_t Tensor::NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor::Tensor(std::vector<int64_t> shape)
    : shape_(std::move(shape)), values_(static_cast<size_t>(NumElements(shape_)), 0.0f) {}

Tensor::Tensor(std::vector<int64_t> shape, FloatBuffer values)
    : shape_(std::move(shape)), values_(std::move(values)) {
  if (NumElements(shape_) != static_cast<int64_t>(values_.size())) {
    throw std::invalid_argument("Tensor: shape " + ShapeToString(shape_) + " does not match " +
                                std::to_string(values_.size()) + " values");
  }
}

void Tensor::Reshape(std::vector<int64_t> shape) {
  if (NumElements(shape) != numel()) {
    throw std::invalid_argument("Tensor::Reshape: " + ShapeToString(shape_) + " -> " +
                                ShapeToString(shape));
  }
  shape_ = std::move(shape);
}

std::string Tensor::ShapeString() const { return ShapeToString(shape_); }

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

}  // namespace attn
