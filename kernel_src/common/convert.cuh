// Conversions and fast math shared by every family: one small inline function per instruction.
#pragma once

#include <cstdint>

namespace ft_common {

// 2^x, approximate (MUFU.EX2); exp2(-inf) = +0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA and integer pipes instead of MUFU (the FlashAttention-4 trick; for a share of
// the softmax's exponentials when MUFU, 16 per clock per SM, is the bottleneck). x is split as
// j + f with j = round(x) (the 1.5 * 2^23 addition leaves j in the low mantissa bits) and
// f in [-0.5, 0.5]; 2^f is a degree-3 polynomial (max relative error 1.03e-4, below fp16's
// half ulp), and j is added to its exponent. x < -126 (including -inf, masked scores) gives
// exactly +0, like exp2_approx; x must stay below 128. Host-callable for its CPU test
// (tests/kernels/exp2_poly_check.cu).
__host__ __device__ __forceinline__ float exp2_poly(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float xc = x < -126.0f ? -126.0f : x;
  const float t = xc + kRound;
  const float f = xc - (t - kRound);
  const float p = fmaf(fmaf(fmaf(0.055007052f, f, 0.24220657f), f, 0.69328266f), f, 1.0f);
#ifdef __CUDA_ARCH__
  const float y = __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
#else
  int pi, ti;
  __builtin_memcpy(&pi, &p, 4);
  __builtin_memcpy(&ti, &t, 4);
  const int yi = static_cast<int>(static_cast<unsigned>(pi) + (static_cast<unsigned>(ti) << 23));
  float y;
  __builtin_memcpy(&y, &yi, 4);
#endif
  return x < -126.0f ? 0.0f : y;
}

// Two fp32 values to one b32 of two 16-bit floats (round to nearest); `lo` in the low half.
template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (kBf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

}  // namespace ft_common
