// Numeric precision of the inference forward, and what the CPU offers for each.
#pragma once

#include <string>
#include <string_view>

namespace attn {

enum class Precision {
  kFp32,  // fp32 everywhere (the reference path; matches Hugging Face to ~1e-5)
  kInt8,  // linear layers on s8 weights (per output channel) x u8 activations (per token, with a
          // zero point; outliers kept in fp32); the attention products Q K^T and P V on AMX
          // tiles in bf16 where the CPU has AMX (head_dim 32 or 64: more accurate than int8 and
          // as fast there), else with AVX-512 VNNI on int8 (engine/ops/vnni_attention.cc);
          // softmax, LayerNorm, GELU and the residual stream stay fp32
  kBf16,  // every matmul (the linear layers and the attention products Q K^T and P V) on
          // bfloat16 inputs with fp32 accumulation; LayerNorm, softmax, GELU and the residual
          // stream fp32. Weights converted once at load.
};

// "float32", "int8" or "bfloat16": the name GetModelInfo and the metrics report.
const char* PrecisionName(Precision precision);

// Accepts "fp32"/"float32", "int8", "bf16"/"bfloat16", and "auto" (resolved here by
// AutoPrecision()); returns false on anything else.
bool ParsePrecision(std::string_view text, Precision* precision);

// Whether the CPU multiplies bfloat16 in hardware (cpuid: avx512_bf16 or amx_bf16).
bool CpuHasNativeBf16();

// Whether the CPU has AVX-512 VNNI (cpuid avx512_vnni): u8 x s8 products summed in 32 bits,
// without the 16-bit saturation of the older multiply-add, so int8 inputs may use 255 levels.
bool CpuHasInt8Vnni();

// Whether the CPU has AMX tiles with int8 / bf16 products (cpuid amx_int8 / amx_bf16, and the
// kernel lets this process use the tile state).
bool CpuHasAmxInt8();
bool CpuHasAmxBf16();

// The fastest precision whose accuracy bound holds on this CPU: kBf16 where it is native,
// else kFp32 (int8 is never picked automatically: its bound is looser).
Precision AutoPrecision();

// Empty if `precision` runs at full speed on this CPU; else why it does not (for the server's
// refusal at start-up, which --allow-slow-precision overrides).
std::string SlowPrecisionReason(Precision precision);

}  // namespace attn
