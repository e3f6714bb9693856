// GPU check of the packed 16-bit exponentials (ex2.approx.f16x2, ex2.approx.ftz.bf16x2) against the fp32
// one the sm90 softmax uses (ex2.approx.ftz.f32): their accuracy over the softmax's arguments, every 16-bit
// x in [-24, 8] (fp16; bf16: [-126, 8]), against double exp2, and their throughput, exponentials per
// nanosecond on the whole GPU, independent chains so that only the MUFU pipe limits them.
//
// On sm_90a ptxas emits two MUFU.EX2.F16 (or .BF16) and a PRMT per ex2.approx.f16x2, so the packed form
// saves MUFU issue only if those ops run faster than MUFU.EX2 on fp32, which this measures.
//
// Prints one line per measurement:
//   accuracy <type> max_rel <worst relative error> mean_rel <mean signed relative error> n <inputs>
//   throughput <type> <exponentials per ns>
// Build and run: nvcc -std=c++17 -O3 -arch=sm_90a -o exp2_packed_check exp2_packed_check.cu && ./exp2_packed_check
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

__device__ __forceinline__ uint32_t ex2_f16x2(uint32_t x) {
  uint32_t y;
  asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t ex2_bf16x2(uint32_t x) {
  uint32_t y;
  asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ float ex2_f32(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool kBf16>
__device__ __forceinline__ uint32_t ex2_packed(uint32_t x) {
  return kBf16 ? ex2_bf16x2(x) : ex2_f16x2(x);
}

// out[i] = 2^in[i] for pairs of 16-bit values
template <bool kBf16>
__global__ void apply_packed(const uint32_t* in, uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ex2_packed<kBf16>(in[i]);
}

// kChains independent chains per thread, kIters steps each: x <- 2^(-x) stays in [0.5, 1]
constexpr int kChains = 8, kIters = 4096;
__global__ void spin_f32(float* sink, float seed) {
  float x[kChains];
  for (int c = 0; c < kChains; ++c) x[c] = seed + 0.01f * c + 1e-6f * threadIdx.x;
  for (int it = 0; it < kIters; ++it)
#pragma unroll
    for (int c = 0; c < kChains; ++c) x[c] = ex2_f32(-x[c]);
  float s = 0.f;
  for (int c = 0; c < kChains; ++c) s += x[c];
  if (s == 12345.f) sink[threadIdx.x] = s;  // never true: keeps the chains alive
}
template <bool kBf16>
__global__ void spin_packed(uint32_t* sink, uint32_t seed) {
  uint32_t x[kChains];
  for (int c = 0; c < kChains; ++c) x[c] = seed + c;
  for (int it = 0; it < kIters; ++it)
#pragma unroll
    for (int c = 0; c < kChains; ++c) x[c] = ex2_packed<kBf16>(x[c]) ^ 0x80008000u;  // 2^(-x)
  uint32_t s = 0;
  for (int c = 0; c < kChains; ++c) s ^= x[c];
  if (s == 0x12345678u) sink[threadIdx.x] = s;
}

static double to_double(uint16_t h, bool bf16) {
  if (bf16) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  __half_raw raw;
  raw.x = h;
  return static_cast<double>(__half2float(__half(raw)));
}

static int accuracy(bool bf16) {
  std::vector<uint16_t> xs;
  const double lo = bf16 ? -126.0 : -24.0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const double x = to_double(uint16_t(h), bf16);
    if (std::isfinite(x) && x >= lo && x <= 8.0) xs.push_back(uint16_t(h));
  }
  if (xs.size() % 2) xs.push_back(xs.back());
  const int n = int(xs.size() / 2);
  uint32_t *d_in, *d_out;
  CHECK(cudaMalloc(&d_in, n * 4));
  CHECK(cudaMalloc(&d_out, n * 4));
  CHECK(cudaMemcpy(d_in, xs.data(), n * 4, cudaMemcpyHostToDevice));
  if (bf16)
    apply_packed<true><<<(n + 255) / 256, 256>>>(d_in, d_out, n);
  else
    apply_packed<false><<<(n + 255) / 256, 256>>>(d_in, d_out, n);
  CHECK(cudaGetLastError());
  std::vector<uint16_t> ys(2 * n);
  CHECK(cudaMemcpy(ys.data(), d_out, n * 4, cudaMemcpyDeviceToHost));
  double worst = 0.0, sum = 0.0;
  long counted = 0;
  const double tiny = bf16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -14);  // normal results only
  for (int i = 0; i < 2 * n; ++i) {
    const double want = std::exp2(to_double(xs[i], bf16)), got = to_double(ys[i], bf16);
    if (want < tiny) continue;
    const double rel = got / want - 1.0;
    worst = std::fmax(worst, std::fabs(rel));
    sum += rel;
    ++counted;
  }
  std::printf("accuracy %s max_rel %.4g mean_rel %.4g n %ld\n", bf16 ? "bf16x2" : "f16x2", worst, sum / counted, counted);
  CHECK(cudaFree(d_in));
  CHECK(cudaFree(d_out));
  return 0;
}

template <class Launch>
static int throughput(const char* name, double exps_per_thread, Launch launch) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * 8, threads = 256;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  launch(blocks, threads);  // warm-up
  CHECK(cudaEventRecord(a));
  for (int r = 0; r < 5; ++r) launch(blocks, threads);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  CHECK(cudaGetLastError());
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double exps = 5.0 * blocks * threads * exps_per_thread;
  std::printf("throughput %s %.4g\n", name, exps / (ms * 1e6));
  return 0;
}

int main() {
  if (accuracy(false) || accuracy(true)) return 1;
  void* sink;
  CHECK(cudaMalloc(&sink, 1024 * 4));
  const double steps = double(kChains) * kIters;
  if (throughput("f32", steps, [&](int g, int t) { spin_f32<<<g, t>>>(static_cast<float*>(sink), 0.3f); }))
    return 1;
  if (throughput("f16x2", 2 * steps,
                 [&](int g, int t) { spin_packed<false><<<g, t>>>(static_cast<uint32_t*>(sink), 0x38003800u); }))
    return 1;
  if (throughput("bf16x2", 2 * steps,
                 [&](int g, int t) { spin_packed<true><<<g, t>>>(static_cast<uint32_t*>(sink), 0x3f003f00u); }))
    return 1;
  return 0;
}
