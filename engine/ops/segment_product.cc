#include "engine/ops/segment_product.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace attn {

absl::Status SegmentProductForward(const float* hidden, int64_t hidden_size,
                                   const std::vector<int64_t>& seq_offsets, const int32_t* type_ids,
                                   float* feature, SegmentProductContext* context) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  const int64_t H = hidden_size;
  SegmentProductContext local;
  SegmentProductContext& ctx = context != nullptr ? *context : local;
  ctx.first_unit.assign(batch * H, 0.0f);
  ctx.second_unit.assign(batch * H, 0.0f);
  ctx.first_norm.assign(batch, 0.0);
  ctx.second_norm.assign(batch, 0.0);
  ctx.first_count.assign(batch, 0);
  ctx.second_count.assign(batch, 0);
  std::vector<double> sums(2 * H);
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(sums.begin(), sums.end(), 0.0);
    int64_t counts[2] = {0, 0};
    for (int64_t t = seq_offsets[b]; t < seq_offsets[b + 1]; ++t) {
      const int32_t type = type_ids[t];
      if (type != 0 && type != 1) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has token type ", type,
                                                       "; a pair head reads types 0 and 1"));
      }
      ++counts[type];
      // Double sums, as PoolForward: segments reach 512 tokens.
      double* sum = sums.data() + type * H;
      const float* row = hidden + t * H;
      for (int64_t j = 0; j < H; ++j) sum[j] += row[j];
    }
    if (counts[0] == 0 || counts[1] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", b, " is not a text pair (no token of its ",
          counts[0] == 0 ? "first" : "second", " text); a pair head reads both texts"));
    }
    float* units[2] = {ctx.first_unit.data() + b * H, ctx.second_unit.data() + b * H};
    double* norms[2] = {&ctx.first_norm[b], &ctx.second_norm[b]};
    for (int s = 0; s < 2; ++s) {
      double squares = 0.0;
      for (int64_t j = 0; j < H; ++j) {
        sums[s * H + j] /= static_cast<double>(counts[s]);
        squares += sums[s * H + j] * sums[s * H + j];
      }
      *norms[s] = std::max(std::sqrt(squares), 1e-12);
      for (int64_t j = 0; j < H; ++j) units[s][j] = static_cast<float>(sums[s * H + j] / *norms[s]);
    }
    ctx.first_count[b] = counts[0];
    ctx.second_count[b] = counts[1];
    float* out = feature + b * H;
    for (int64_t j = 0; j < H; ++j) out[j] = units[0][j] * units[1][j];
  }
  return absl::OkStatus();
}

void SegmentProductBackward(const SegmentProductContext& context, int64_t hidden_size,
                            const std::vector<int64_t>& seq_offsets, const int32_t* type_ids,
                            const float* dfeature, float* dhidden) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  if (batch < 0) return;
  const int64_t H = hidden_size;
  std::fill(dhidden, dhidden + seq_offsets[batch] * H, 0.0f);
  std::vector<float> dsegment(2 * H);  // d a and d c of one sequence, already / count
  for (int64_t b = 0; b < batch; ++b) {
    const float* units[2] = {context.first_unit.data() + b * H, context.second_unit.data() + b * H};
    const double norms[2] = {context.first_norm[b], context.second_norm[b]};
    const int64_t counts[2] = {context.first_count[b], context.second_count[b]};
    const float* dout = dfeature + b * H;
    for (int s = 0; s < 2; ++s) {
      const float* unit = units[s];
      const float* other = units[1 - s];
      double dot = 0.0;  // unit · d(unit), d(unit) = dout ⊙ other
      for (int64_t j = 0; j < H; ++j) dot += double{unit[j]} * dout[j] * other[j];
      for (int64_t j = 0; j < H; ++j) {
        const double dunit = double{dout[j]} * other[j];
        dsegment[s * H + j] =
            static_cast<float>((dunit - unit[j] * dot) / norms[s] / static_cast<double>(counts[s]));
      }
    }
    for (int64_t t = seq_offsets[b]; t < seq_offsets[b + 1]; ++t) {
      const float* d = dsegment.data() + type_ids[t] * H;
      float* dst = dhidden + t * H;
      for (int64_t j = 0; j < H; ++j) dst[j] = d[j];
    }
  }
}

}  // namespace attn
