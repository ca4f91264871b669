// Numeric precision of the inference forward.
#pragma once

#include <string_view>

namespace attn {

enum class Precision {
  kFp32,  // fp32 everywhere (the reference path; matches Hugging Face to ~1e-5)
  kInt8,  // linear layers on s8 weights (per output channel) x u8 activations (per token, with a
          // zero point; outliers kept in fp32); attention, softmax, LayerNorm, GELU and the
          // residual stream stay fp32
};

// "float32" or "int8": the name GetModelInfo and the metrics report.
inline const char* PrecisionName(Precision precision) {
  return precision == Precision::kInt8 ? "int8" : "float32";
}

// Accepts "fp32", "float32" and "int8"; returns false on anything else.
inline bool ParsePrecision(std::string_view text, Precision* precision) {
  if (text == "fp32" || text == "float32") {
    *precision = Precision::kFp32;
    return true;
  }
  if (text == "int8") {
    *precision = Precision::kInt8;
    return true;
  }
  return false;
}

}  // namespace attn
