// oneDNN runtime shared by all forwards: one CPU engine and a cache of primitives keyed by
// (op, shapes, attributes). Primitives are built once per key and reused; they run with a
// user-provided scratchpad so concurrent forwards on different threads never share state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "engine/tensor.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace attn {

struct CachedPrimitive {
  dnnl::primitive primitive;
  dnnl::memory::desc scratchpad_desc;
};

class DnnlRuntime {
 public:
  // The process-wide runtime.
  static DnnlRuntime& Get();

  const dnnl::engine& engine() const { return engine_; }

  // Returns the primitive cached under `key`, building it with `make` on first use. `make`
  // must build the primitive descriptor with scratchpad_mode::user.
  CachedPrimitive GetOrCreate(const std::string& shape_key,
                              const std::function<CachedPrimitive()>& make);

  int64_t cache_hits() const;
  int64_t cache_misses() const;

 private:
  DnnlRuntime();

  dnnl::engine engine_;
  mutable absl::Mutex mutex_;
  std::unordered_map<std::string, CachedPrimitive> cache_ ABSL_GUARDED_BY(mutex_);
  int64_t hits_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mutex_) = 0;
};

// Per-call execution state: a stream and a growable scratchpad. Not shared between threads.
class ExecContext {
 public:
  ExecContext();
  explicit ExecContext(DnnlRuntime& runtime);

  DnnlRuntime& runtime() { return runtime_; }
  const dnnl::engine& engine() const { return runtime_.engine(); }
  dnnl::stream& stream() { return stream_; }

  // Wraps a raw pointer as a oneDNN memory (no copy).
  dnnl::memory Wrap(const dnnl::memory::desc& desc, const float* data) const;

  // Executes `cached` with `args` plus this context's scratchpad, and waits.
  void Execute(const CachedPrimitive& cached, std::unordered_map<int, dnnl::memory> args);

  // At least `floats` of working memory for an op's rearranged operand; valid until the next
  // call. Grows and never shrinks: keep the context to reuse it.
  float* OperandBuffer(int64_t floats);

 private:
  DnnlRuntime& runtime_;
  dnnl::stream stream_;
  FloatBuffer scratchpad_;
  FloatBuffer operand_;
};

// Builds a plain row-major f32 desc from dims.
dnnl::memory::desc RowMajorDesc(const dnnl::memory::dims& dims);
// A f32 desc with explicit strides (in elements).
dnnl::memory::desc StridedDesc(const dnnl::memory::dims& dims, const dnnl::memory::dims& strides);

}  // namespace attn
