// Planted faulty kernels with the `flat` ABI (kernel_src/README.md), for the fault-isolation tests.
// FAULT selects the failure: 1 = hang (spins forever), 2 = illegal address, 3 = writes NaN,
// 4 = writes NaN and also into its input q (the worker keeps a problem's inputs for later jobs).
#include <cuda_fp16.h>

extern "C" __global__ void flashtune_fwd(
    const __half* q, const __half* k, const __half* v, __half* o, float* lse,
    int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
    long long, long long, long long, long long, long long, long long,
    long long, long long, long long, long long, long long, long long, float) {
#if FAULT == 1
  volatile int* flag = reinterpret_cast<volatile int*>(lse);
  while (flag[0] == flag[0]) {}  // volatile reads of the same word: spins until the worker is killed
#elif FAULT == 2
  reinterpret_cast<volatile float*>(0x10)[threadIdx.x] = 1.0f;
#else
#if FAULT == 4
  if (blockIdx.x == 0 && threadIdx.x == 0) const_cast<__half*>(q)[0] = __hadd(q[0], __float2half(1.0f));
#endif
  long long n = 1LL * batch * seqlen_q * heads_q * 128;
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 1LL * gridDim.x * blockDim.x)
    o[i] = __float2half(__int_as_float(0x7fc00000));
  long long m = 1LL * batch * heads_q * seqlen_q;
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += 1LL * gridDim.x * blockDim.x) lse[i] = 0.f;
#endif
}
