// Per-warpgroup and per-thread helpers: register reallocation, warp election, fast exp2.
#pragma once

#include <cstdint>

#include "common/convert.cuh"

namespace ft_sm90::ptx {

// setmaxnreg: move registers between warpgroups. Takes effect only with a register cap at
// kernel entry (__launch_bounds__(threads, 1)) and one branch per warpgroup role.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// One lane of the (fully active) warp returns true.
__device__ __forceinline__ bool elect_one() {
  uint32_t elected;
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 lane;\n"
      "elect.sync lane|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(elected));
  return elected != 0;
}

// Fast exp2 and 16-bit packing: shared with the other families.
using ::ft_common::exp2_approx;
using ::ft_common::exp2_poly;
using ::ft_common::pack2;

}  // namespace ft_sm90::ptx
