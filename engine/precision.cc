#include "engine/precision.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace attn {

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kInt8:
      return "int8";
    case Precision::kBf16:
      return "bfloat16";
    case Precision::kFp32:
      break;
  }
  return "float32";
}

bool ParsePrecision(std::string_view text, Precision* precision) {
  if (text == "fp32" || text == "float32") {
    *precision = Precision::kFp32;
  } else if (text == "int8") {
    *precision = Precision::kInt8;
  } else if (text == "bf16" || text == "bfloat16") {
    *precision = Precision::kBf16;
  } else if (text == "auto") {
    *precision = AutoPrecision();
  } else {
    return false;
  }
  return true;
}

bool CpuHasNativeBf16() {
  // cpuid leaf 7: sub-leaf 1 EAX bit 5 = AVX512_BF16; sub-leaf 0 EDX bit 22 = AMX-BF16.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool amx_bf16 = (edx >> 22) & 1;
  const unsigned max_subleaf = eax;
  bool avx512_bf16 = false;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    avx512_bf16 = (eax >> 5) & 1;
  }
  return amx_bf16 || avx512_bf16;
}

bool CpuHasInt8Vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") != 0;
}

namespace {

// cpuid leaf 7 sub-leaf 0 EDX: bit 22 AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8; and Linux must
// grant the process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, which
// oneDNN requests too; asking twice is harmless). Read once: in a VM every cpuid traps to the
// hypervisor (asked per attention call it was a tenth of a 1 x 16 forward).
bool CpuHasAmx(int feature_bit) {
  static const unsigned usable_bits = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return 0u;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (((edx >> 24) & 1) == 0) return 0u;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0 ? edx : 0u;
  }();
  return (usable_bits >> feature_bit) & 1;
}

}  // namespace

bool CpuHasAmxInt8() { return CpuHasAmx(25); }

bool CpuHasAmxBf16() { return CpuHasAmx(22); }

Precision AutoPrecision() { return CpuHasNativeBf16() ? Precision::kBf16 : Precision::kFp32; }

std::string SlowPrecisionReason(Precision precision) {
  if (precision != Precision::kBf16 || CpuHasNativeBf16()) return "";
  return "this CPU has no bfloat16 instructions (neither avx512_bf16 nor amx_bf16 in cpuid), so "
         "bfloat16 runs emulated (inputs rounded to bfloat16, fp32 matmuls): no faster than "
         "float32 and less accurate";
}

}  // namespace attn
