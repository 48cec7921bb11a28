// Standalone A/B of conv2d direct kernels (each a .so exporting oasr_conv2d_run), fp16 NHWC, relu.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
#include <cmath>
typedef int (*run_fn)(const void*, const void*, const void*, void*, int, int, int, int, int, int, int, int, int, int,
                      int, int, void*, size_t, void*);
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

__global__ void ref_kernel(const __half* x, const __half* w, const __half* b, float* y, int B, int H, int W, int Cin,
                           int Cout, int KH, int KW, int sh, int sw, int ph, int pw, int Ho, int Wo) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  long long n = (long long)B * Ho * Wo * Cout;
  if (i >= n) return;
  int co = i % Cout; long long m = i / Cout; int wo = m % Wo; long long bh = m / Wo; int ho = bh % Ho; int bb = bh / Ho;
  double acc = __half2float(b[co]);
  for (int r = 0; r < KH; ++r) for (int s = 0; s < KW; ++s) for (int ci = 0; ci < Cin; ++ci) {
    int hi = ho * sh - ph + r, wi = wo * sw - pw + s;
    if (hi < 0 || hi >= H || wi < 0 || wi >= W) continue;
    acc += (double)__half2float(x[(((long long)bb * H + hi) * W + wi) * Cin + ci]) * (double)__half2float(w[((co * KH + r) * KW + s) * Cin + ci]);
  }
  y[i] = acc > 0 ? (float)acc : 0.f;
}
__global__ void cmp_kernel(const __half* y, const float* ref, long long n, float* out) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = __half2float(y[i]);
  float d = fabsf(v - ref[i]);
  float tol = 1e-3f + 1e-3f * fabsf(ref[i]);
  if (!(d <= tol)) atomicAdd(out, 1.f);
  // max abs err (positive floats compare as ints)
  if (d == d) atomicMax((int*)(out + 1), __float_as_int(d)); else atomicAdd(out + 2, 1.f);
}
__global__ void fill(__half* p, long long n, unsigned seed, float scale) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned h = (unsigned)(i * 2654435761u) ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
  p[i] = __float2half(((h & 0xFFFFFF) / 16777216.f * 2.f - 1.f) * scale);
}
__global__ void write_kernel(int4* p, long long n) {  // the store roofline: 16-byte stores, grid-stride
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = make_int4(0, 1, 2, 3);
}
struct Shape { int B, H, W, Cin, Cout, KH, KW, sh, sw, ph, pw; };
// The write roofline at an output size: cudaMemsetAsync and a plain 16-byte store kernel, median of 5 x 20 calls.
void roofline(long long bytes) {
  void* p; CK(cudaMalloc(&p, bytes));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> t;
    for (int round = 0; round < 5; ++round) {
      cudaEventRecord(e0);
      for (int i = 0; i < 20; ++i) {
        if (kind == 0) cudaMemsetAsync(p, 0, bytes);
        else write_kernel<<<132 * 16, 256>>>((int4*)p, bytes / 16);
      }
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000.f / 20);
    }
    std::sort(t.begin(), t.end());
    printf("roofline %-12s %.1f MB: median %.1f us  %.2f TB/s\n", kind ? "store kernel" : "memset", bytes / 1e6, t[2],
           bytes / (t[2] * 1e-6) / 1e12);
  }
  cudaFree(p);
}
int main(int argc, char** argv) {
  std::vector<std::string> libs(argv + 1, argv + argc);
  std::vector<Shape> shapes = {
    {16, 1000, 80, 1, 512, 3, 3, 2, 2, 0, 0},   // Conformer M frontend conv1
    {16, 1027, 80, 1, 256, 3, 3, 2, 2, 0, 0},
    {8, 3000, 80, 1, 512, 3, 3, 2, 2, 0, 0},
    {16, 1000, 80, 1, 1024, 3, 3, 2, 2, 0, 0},
    {1, 7, 80, 1, 512, 3, 3, 2, 2, 0, 0},
    {3, 17, 80, 1, 256, 3, 3, 2, 2, 1, 1},      // padding: border path
    {2, 33, 80, 2, 256, 3, 3, 2, 2, 0, 0},      // Cin = 2: the staged kernel
  };
  roofline(16LL * 499 * 39 * 512 * 2);  // Conformer M's first conv output
  for (auto& s : shapes) {
    int Ho = (s.H + 2 * s.ph - s.KH) / s.sh + 1, Wo = (s.W + 2 * s.pw - s.KW) / s.sw + 1;
    long long nx = (long long)s.B * s.H * s.W * s.Cin, nw = (long long)s.Cout * s.KH * s.KW * s.Cin;
    long long ny = (long long)s.B * Ho * Wo * s.Cout;
    __half *x, *w, *b, *y; float *ref, *cmp;
    CK(cudaMalloc(&x, nx * 2)); CK(cudaMalloc(&w, nw * 2)); CK(cudaMalloc(&b, s.Cout * 2)); CK(cudaMalloc(&y, ny * 2));
    CK(cudaMalloc(&ref, ny * 4)); CK(cudaMalloc(&cmp, 16));
    fill<<<(nx + 255) / 256, 256>>>(x, nx, 1234u, 3.f);
    fill<<<(nw + 255) / 256, 256>>>(w, nw, 999u, 0.5f);
    fill<<<(s.Cout + 255) / 256, 256>>>(b, s.Cout, 77u, 0.3f);
    ref_kernel<<<(ny + 255) / 256, 256>>>(x, w, b, ref, s.B, s.H, s.W, s.Cin, s.Cout, s.KH, s.KW, s.sh, s.sw, s.ph, s.pw, Ho, Wo);
    CK(cudaDeviceSynchronize());
    printf("shape B=%d H=%d W=%d Cin=%d Cout=%d s=%d p=%d  out %.1f MB\n", s.B, s.H, s.W, s.Cin, s.Cout, s.sh, s.ph, ny * 2 / 1e6);
    for (auto& lib : libs) {
      void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) { printf("  %s: dlopen failed %s\n", lib.c_str(), dlerror()); continue; }
      run_fn run = (run_fn)dlsym(h, "oasr_conv2d_run");
      auto call = [&]() { return run(x, w, b, y, s.B, s.H, s.W, s.Cin, s.Cout, s.KH, s.KW, s.sh, s.sw, s.ph, s.pw, 1, nullptr, 0, nullptr); };
      CK(cudaMemset(y, 0xFF, ny * 2));  // NaN poison
      CK(cudaMemset(cmp, 0, 16));
      int st = call();
      CK(cudaDeviceSynchronize());
      if (st) { printf("  %-28s status %d\n", lib.c_str(), st); continue; }
      cmp_kernel<<<(ny + 255) / 256, 256>>>(y, ref, ny, cmp);
      float c[3]; CK(cudaMemcpy(c, cmp, 12, cudaMemcpyDeviceToHost));
      int reps = ny > 50000000 ? 20 : 200;
      std::vector<float> t;
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      for (int round = 0; round < 5; ++round) {
        cudaEventRecord(e0);
        for (int i = 0; i < reps; ++i) call();
        cudaEventRecord(e1); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000.f / reps);
      }
      std::sort(t.begin(), t.end());
      printf("  %-28s bad=%g maxerr=%.3g nan=%g  median %.1f us (min %.1f)  %.2f TB/s out\n", lib.c_str(), c[0], *(float*)&c[1], c[2], t[2], t[0], ny * 2 / (t[2] * 1e-6) / 1e12);
    }
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y); cudaFree(ref); cudaFree(cmp);
  }
  return 0;
}
