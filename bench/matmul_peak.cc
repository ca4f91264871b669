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
#include <omp.h>

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
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
