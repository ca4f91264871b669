// Tensor: a dense, row-major fp32 array with a shape. Storage is 64-byte aligned so oneDNN
// can use it directly. Copyable (deep copy); moves are cheap.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace attn {

// `bytes` (rounded up) aligned to `alignment`; std::bad_alloc when out of memory. While a
// ScopedHugePages lives on the calling thread, buffers of 4 MiB and more are 2 MiB-aligned and
// advised for transparent huge pages.
void* AllocateAligned(std::size_t bytes, std::size_t alignment);

// Huge pages for the large buffers this thread allocates while the scope lives. For long-lived
// buffers only: the trainer's weights, gradients, moments and activations (~0.7 GB streamed
// every step, much of it through strided matmul reads that touch a new 4 KB page per row).
// Not for per-request buffers: faulting fresh huge pages on a busy machine can stall in
// compaction (the mixed-length inference benchmark ran 40% slower with them).
class ScopedHugePages {
 public:
  ScopedHugePages();
  ~ScopedHugePages();
  ScopedHugePages(const ScopedHugePages&) = delete;
  ScopedHugePages& operator=(const ScopedHugePages&) = delete;

 private:
  bool previous_;
};

template <typename T, std::size_t kAlignment = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, kAlignment>&) {}  // NOLINT
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, kAlignment>;
  };
  T* allocate(std::size_t n) { return static_cast<T*>(AllocateAligned(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) { std::free(p); }
  bool operator==(const AlignedAllocator&) const { return true; }
  bool operator!=(const AlignedAllocator&) const { return false; }
};

using FloatBuffer = std::vector<float, AlignedAllocator<float>>;

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor of the given shape.
  explicit Tensor(std::vector<int64_t> shape);
  Tensor(std::vector<int64_t> shape, FloatBuffer values);

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const { return static_cast<int64_t>(values_.size()); }
  bool empty() const { return values_.empty(); }

  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  FloatBuffer& values() { return values_; }
  const FloatBuffer& values() const { return values_; }

  // Same data, new shape with the same element count.
  void Reshape(std::vector<int64_t> shape);
  // "[2, 3, 4]"
  std::string ShapeString() const;

  static int64_t NumElements(const std::vector<int64_t>& shape);

 private:
  std::vector<int64_t> shape_;
  FloatBuffer values_;
};

std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace attn
