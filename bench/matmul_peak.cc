// attn-bench-matmul-peak: the host's oneDNN matmul throughput per precision, the physical limit
// the harness quotes next to its tables (issue 15): a workload's matmul FLOPs at this peak is
// the fastest any engine built on these kernels could run it.
//
// For each precision (fp32: f32 x f32 -> f32; bf16: bf16 x bf16 -> f32, fp32 accumulation;
// int8: u8 x s8 -> s32) and each M x K x N shape, one oneDNN matmul primitive with the weights
// in the layout oneDNN prefers (format "any", reordered once, as the engine packs at load),
// timed as the median of --repeats, each long enough to fill --seconds / --repeats. The peak of a
// precision is its fastest shape. One JSON line on stdout:
//   {"onednn": "2.6.3", "threads": 2, "precisions": {"fp32": {"impl": "brg:avx512_core",
//    "peak_gflops": 412.3, "shapes": [{"m": .., "k": .., "n": .., "gflops": ..}, ...]}, ...}}
// A precision with only oneDNN's reference kernel on this CPU is reported with "impl": "ref..."
// and "peak_gflops": null (not timed: it is not a kernel anyone would serve with); one oneDNN
// has no kernel for at all (bf16 before AVX-512: it reports "unimplemented") with
// "impl": "unimplemented" and "peak_gflops": null.
//
// Beside the peaks, the memory bandwidth (issue 34): with the same threads, a STREAM-style read of
// a buffer larger than the last-level cache (twice its size, at least 256 MiB; --bandwidth-mb),
// each thread summing its contiguous share, the fastest of --repeats passes after one untimed
// pass (another process can only slow a pass down). A batch-1 forward reads every weight from
// memory once, so its limit is the larger of its FLOPs at the matmul peak and its bytes at this
// bandwidth. It is reported as
//   "memory": {"llc_bytes": .., "buffer_bytes": .., "threads": 2, "read_gbps": 17.3,
//              "cached_buffer_bytes": .., "cached_read_gbps": 80.1}
// where the "cached" figure reads a buffer of a quarter of the last-level cache (at most 64 MiB)
// that stays there: what a forward whose weights the cache kept between calls could stream.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/cli_util.h"
#include "nlohmann/json.hpp"
#include "oneapi/dnnl/dnnl.hpp"

ABSL_FLAG(std::string, shapes,
          "4096x384x1152,4096x384x384,4096x384x1536,4096x1536x384,2048x2048x2048",
          "Comma-separated M x K x N shapes (M rows of input, K inputs, N outputs). The default "
          "is all-MiniLM-L6-v2's linear layers at 32 x 128 tokens and one large square.");
ABSL_FLAG(std::string, precisions, "fp32,bf16,int8", "Comma-separated subset of fp32,bf16,int8.");
ABSL_FLAG(int, threads, 0, "OpenMP threads; 0 = all cores.");
ABSL_FLAG(double, seconds, 1.0, "Timed seconds per shape and precision (split over --repeats).");
ABSL_FLAG(int, repeats, 5, "Timed repeats per shape; the median is reported.");
ABSL_FLAG(int64_t, bandwidth_mb, -1,
          "Memory bandwidth: MiB of the buffer read; -1 = twice the last-level cache, at least "
          "256 MiB; 0 = do not measure.");

namespace {

using dnnl::memory;
using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t m, k, n;
};

struct PrecisionTypes {
  memory::data_type src, weights, dst;
};

bool ParseShapes(const std::string& text, std::vector<Shape>* shapes, std::string* error) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> dims = absl::StrSplit(item, 'x');
    Shape shape{};
    if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &shape.m) ||
        !absl::SimpleAtoi(dims[1], &shape.k) || !absl::SimpleAtoi(dims[2], &shape.n) ||
        shape.m < 1 || shape.k < 1 || shape.n < 1 || shape.m * shape.k > (int64_t{1} << 28) ||
        shape.k * shape.n > (int64_t{1} << 28) || shape.m * shape.n > (int64_t{1} << 28)) {
      *error = absl::StrCat("--shapes: '", item.substr(0, 40),
                            "' is not M x K x N with positive sizes of at most 2^28 elements per "
                            "matrix (e.g. 4096x384x1152)");
      return false;
    }
    shapes->push_back(shape);
  }
  if (shapes->empty()) *error = "--shapes: no shape given";
  return !shapes->empty();
}

// A plain row-major buffer of `desc`, every element set to one small value of its type: the
// values do not change the kernels' speed, and none is denormal.
memory FilledPlain(const dnnl::engine& cpu, const memory::desc& desc) {
  memory mem(desc, cpu);
  const size_t bytes = desc.get_size();
  auto* data = static_cast<uint8_t*>(mem.get_data_handle());
  switch (desc.data_type()) {
    case memory::data_type::f32: {
      const float value = 0.01f;
      for (size_t i = 0; i < bytes / 4; ++i) std::memcpy(data + 4 * i, &value, 4);
      break;
    }
    case memory::data_type::bf16: {
      const uint16_t value = 0x3c24;  // 0.01 in bfloat16
      for (size_t i = 0; i < bytes / 2; ++i) std::memcpy(data + 2 * i, &value, 2);
      break;
    }
    default:
      std::memset(data, 1, bytes);  // u8 / s8: 1
  }
  return mem;
}

// Median seconds of one call of `run`, over `repeats` timed batches of calls.
template <typename Run>
double MedianSecondsPerCall(const Run& run, double seconds, int repeats) {
  run();  // first call: oneDNN's JIT and caches
  const auto start = Clock::now();
  run();
  const double one = std::chrono::duration<double>(Clock::now() - start).count();
  const int calls = std::max(1, static_cast<int>(seconds / repeats / std::max(one, 1e-6)));
  std::vector<double> per_call;
  for (int r = 0; r < repeats; ++r) {
    const auto begin = Clock::now();
    for (int c = 0; c < calls; ++c) run();
    per_call.push_back(std::chrono::duration<double>(Clock::now() - begin).count() / calls);
  }
  std::nth_element(per_call.begin(), per_call.begin() + repeats / 2, per_call.end());
  return per_call[repeats / 2];
}

nlohmann::json MeasurePrecision(const dnnl::engine& cpu, dnnl::stream& stream,
                                const PrecisionTypes& types, const std::vector<Shape>& shapes,
                                double seconds, int repeats) {
  nlohmann::json result{
      {"impl", nullptr}, {"peak_gflops", nullptr}, {"shapes", nlohmann::json::array()}};
  double peak = 0;
  for (const Shape& s : shapes) {
    const memory::desc src_desc({s.m, s.k}, types.src, memory::format_tag::ab);
    const memory::desc any_weights({s.k, s.n}, types.weights, memory::format_tag::any);
    const memory::desc dst_desc({s.m, s.n}, types.dst, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd;
    try {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_desc, any_weights, dst_desc), cpu);
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented) throw;
      result["impl"] = "unimplemented";
      return result;
    }
    const std::string impl = pd.impl_info_str();
    result["impl"] = impl;
    if (absl::StartsWith(impl, "ref")) return result;  // not timed: see the header
    memory src = FilledPlain(cpu, src_desc);
    memory plain_weights =
        FilledPlain(cpu, memory::desc({s.k, s.n}, types.weights, memory::format_tag::ab));
    memory weights(pd.weights_desc(), cpu);
    dnnl::reorder(plain_weights, weights).execute(stream, plain_weights, weights);
    memory dst(dst_desc, cpu);
    const dnnl::matmul matmul(pd);
    const auto run = [&] {
      matmul.execute(stream,
                     {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
      stream.wait();
    };
    const double per_call = MedianSecondsPerCall(run, seconds, repeats);
    const double gflops = 2.0 * s.m * s.k * s.n / per_call / 1e9;
    peak = std::max(peak, gflops);
    result["shapes"].push_back({{"m", s.m}, {"k", s.k}, {"n", s.n}, {"gflops", gflops}});
  }
  result["peak_gflops"] = peak;
  return result;
}

// Bytes of the last-level cache (L3, else L2) sysconf reports; 0 if it reports none.
int64_t LastLevelCacheBytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(name);
    if (bytes > 0) return bytes;
  }
  return 0;
}

// A sum over `bytes` (a multiple of 128) at p, four independent 256-bit streams: the loads are
// what is timed, the sum keeps the compiler from dropping them.
__attribute__((target("avx2"))) uint64_t SumBytesAvx2(const uint8_t* p, size_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < bytes; i += 128) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t SumBytesPortable(const uint8_t* p, size_t bytes) {
  uint64_t sums[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < bytes; i += 32) {
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * lane, 8);
      sums[lane] += v;
    }
  }
  return sums[0] + sums[1] + sums[2] + sums[3];
}

// GB/s (1e9 bytes) of reading `bytes` with every OpenMP thread, each its contiguous share: the
// fastest of `repeats` passes after an untimed one. The buffer is written first by the thread
// that reads that part (pages faulted in, and on its node).
double ReadBandwidthGBps(size_t bytes, int repeats) {
  constexpr size_t kAlign = size_t{2} << 20;
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  auto* data = static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes));
  if (data == nullptr) return 0.0;
  madvise(data, bytes, MADV_HUGEPAGE);  // as the engine's weight slabs: no TLB walk per 4 KB
  const bool avx2 = __builtin_cpu_supports("avx2");
  const int threads = omp_get_max_threads();
  const size_t share = bytes / threads / 128 * 128;
  std::vector<double> seconds;
  uint64_t checksum = 0;
  for (int pass = -1; pass < repeats; ++pass) {
    const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : checksum)
    {
      uint8_t* part = data + omp_get_thread_num() * share;
      if (pass < 0) std::memset(part, omp_get_thread_num() + 1, share);
      checksum += avx2 ? SumBytesAvx2(part, share) : SumBytesPortable(part, share);
    }
    if (pass >= 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::free(data);
  if (checksum == 42) std::fprintf(stderr, " ");  // uses the sum
  return static_cast<double>(share) * threads / *std::min_element(seconds.begin(), seconds.end()) /
         1e9;
}

nlohmann::json MeasureMemory(int64_t buffer_mb, int repeats) {
  const int64_t llc = LastLevelCacheBytes();
  const int64_t buffer =
      buffer_mb > 0 ? buffer_mb << 20 : std::max<int64_t>(2 * llc, int64_t{256} << 20);
  nlohmann::json result{{"llc_bytes", llc},
                        {"buffer_bytes", buffer},
                        {"threads", omp_get_max_threads()},
                        {"read_gbps", ReadBandwidthGBps(buffer, repeats)}};
  if (llc >= (int64_t{8} << 20)) {
    const int64_t cached = std::min<int64_t>(llc / 4, int64_t{64} << 20);
    result["cached_buffer_bytes"] = cached;
    // Many passes: one pass of a cached buffer takes about a millisecond.
    result["cached_read_gbps"] = ReadBandwidthGBps(cached, std::max(repeats, 1) * 20 + 1);
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures oneDNN matmul GFLOP/s (GOP/s for int8) per precision on this host: "
      "attn-bench-matmul-peak --threads 2 [--shapes 4096x384x1152,...] [--precisions fp32,bf16]");
  attn::ShowProjectFlagsInHelp("attn-bench-matmul-peak 0.2.0");
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  std::vector<Shape> shapes;
  std::string error;
  if (!ParseShapes(absl::GetFlag(FLAGS_shapes), &shapes, &error)) {
    std::fprintf(stderr, "attn-bench-matmul-peak: %s\n", error.c_str());
    return 2;
  }
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (!(seconds > 0 && seconds <= 600) || repeats < 1 || repeats > 1000) {
    std::fprintf(stderr,
                 "attn-bench-matmul-peak: need 0 < --seconds <= 600, 1 <= --repeats <= 1000\n");
    return 2;
  }
  const int64_t bandwidth_mb = absl::GetFlag(FLAGS_bandwidth_mb);
  if (bandwidth_mb < -1 || bandwidth_mb > (int64_t{1} << 16)) {
    std::fprintf(stderr, "attn-bench-matmul-peak: --bandwidth-mb must be -1, 0 or 1..65536\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));

  const std::vector<std::pair<std::string, PrecisionTypes>> known = {
      {"fp32", {memory::data_type::f32, memory::data_type::f32, memory::data_type::f32}},
      {"bf16", {memory::data_type::bf16, memory::data_type::bf16, memory::data_type::f32}},
      {"int8", {memory::data_type::u8, memory::data_type::s8, memory::data_type::s32}}};
  std::vector<std::pair<std::string, PrecisionTypes>> chosen;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_precisions), ',', absl::SkipEmpty())) {
    auto it =
        std::find_if(known.begin(), known.end(), [&](const auto& p) { return p.first == name; });
    if (it == known.end()) {
      std::fprintf(stderr, "attn-bench-matmul-peak: --precisions: '%s' is not fp32, bf16 or int8\n",
                   std::string(name.substr(0, 20)).c_str());
      return 2;
    }
    chosen.push_back(*it);
  }

  const dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(cpu);
  const dnnl_version_t* version = dnnl_version();
  nlohmann::json out{
      {"onednn", absl::StrCat(version->major, ".", version->minor, ".", version->patch)},
      {"threads", omp_get_max_threads()},
      {"precisions", nlohmann::json::object()}};
  for (const auto& [name, types] : chosen) {
    out["precisions"][name] = MeasurePrecision(cpu, stream, types, shapes, seconds, repeats);
    std::fprintf(stderr, "attn-bench-matmul-peak: %s %s\n", name.c_str(),
                 out["precisions"][name].dump().c_str());
  }
  if (bandwidth_mb != 0) {
    out["memory"] = MeasureMemory(bandwidth_mb, repeats);
    std::fprintf(stderr, "attn-bench-matmul-peak: memory %s\n", out["memory"].dump().c_str());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
