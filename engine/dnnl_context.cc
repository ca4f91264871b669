#include "engine/dnnl_context.h"

#include <omp.h>

#include "absl/strings/str_cat.h"

namespace attn {

DnnlRuntime& DnnlRuntime::Get() {
  static DnnlRuntime* runtime = new DnnlRuntime();  // never destroyed: used until exit
  return *runtime;
}

DnnlRuntime::DnnlRuntime() : engine_(dnnl::engine::kind::cpu, 0) {}

CachedPrimitive DnnlRuntime::GetOrCreate(const std::string& shape_key,
                                         const std::function<CachedPrimitive()>& make) {
  // oneDNN fixes a primitive's thread count (and its scratchpad size) when it is built, and the
  // batcher and the training thread run with different OpenMP thread counts.
  const std::string key = absl::StrCat(shape_key, "@t", omp_get_max_threads());
  {
    absl::MutexLock lock(&mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      ++hits_;
      return it->second;
    }
  }
  // Build outside the lock: creation can take milliseconds and other shapes should not wait.
  CachedPrimitive built = make();
  absl::MutexLock lock(&mutex_);
  auto [it, inserted] = cache_.emplace(key, std::move(built));
  ++misses_;
  return it->second;
}

int64_t DnnlRuntime::cache_hits() const {
  absl::MutexLock lock(&mutex_);
  return hits_;
}
int64_t DnnlRuntime::cache_misses() const {
  absl::MutexLock lock(&mutex_);
  return misses_;
}
ExecContext::ExecContext() : ExecContext(DnnlRuntime::Get()) {}

ExecContext::ExecContext(DnnlRuntime& runtime) : runtime_(runtime), stream_(runtime.engine()) {}

dnnl::memory ExecContext::Wrap(const dnnl::memory::desc& desc, const float* data) const {
  // oneDNN takes a non-const handle; inputs are only read.
  return dnnl::memory(desc, runtime_.engine(), const_cast<float*>(data));
}

void ExecContext::Execute(const CachedPrimitive& cached,
                          std::unordered_map<int, dnnl::memory> args) {
  const size_t scratch_bytes = cached.scratchpad_desc.get_size();
  if (scratch_bytes > 0) {
    const size_t floats = (scratch_bytes + sizeof(float) - 1) / sizeof(float);
    if (scratchpad_.size() < floats) scratchpad_.resize(floats);
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(cached.scratchpad_desc, runtime_.engine(), scratchpad_.data()));
  }
  cached.primitive.execute(stream_, args);
  stream_.wait();
}

float* ExecContext::OperandBuffer(int64_t floats) {
  if (static_cast<int64_t>(operand_.size()) < floats) operand_.resize(floats);
  return operand_.data();
}

dnnl::memory::desc RowMajorDesc(const dnnl::memory::dims& dims) {
  dnnl::memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * dims[i + 1];
  }
  return StridedDesc(dims, strides);
}

dnnl::memory::desc StridedDesc(const dnnl::memory::dims& dims, const dnnl::memory::dims& strides) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

}  // namespace attn
