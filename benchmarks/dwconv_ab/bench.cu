// Standalone depthwise conv1d microbenchmark (benchmarks/dwconv_ab): the template at a git revision (base_*) vs the
// template in the tree (repo_*), checked against a naive fp32 reference, timed as a CUDA graph of 100 launches (median of 5).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <random>
#include <string>
#define OASR_EXPORT
#ifndef VARIANTS_INC
#define VARIANTS_INC "variants.inc"
#endif
#include VARIANTS_INC

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)

// One thread per output, fp32, accurate expf.
__global__ void ref_kernel(const __half* x, const float* w, const float* bias, float* y, int B, int T, int C, int Kw,
                           int act, int glu, int bct) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  long long n = (long long)B * T * C;
  if (i >= n) return;
  int b, t, c;
  if (bct) { t = i % T; c = (i / T) % C; b = i / ((long long)T * C); }
  else { c = i % C; t = (i / C) % T; b = i / ((long long)T * C); }
  const int cin = glu ? 2 * C : C;
  float acc = bias ? bias[c] : 0.f;
  for (int k = 0; k < Kw; ++k) {
    int tt = t - Kw / 2 + k;
    if (tt < 0 || tt >= T) continue;
    long long ia = bct ? ((long long)b * cin + c) * T + tt : ((long long)b * T + tt) * cin + c;
    long long ig = bct ? ia + (long long)C * T : ia + C;
    float a = __half2float(x[ia]);
    if (glu) a = a / (1.f + expf(-__half2float(x[ig])));
    acc = fmaf(a, w[c * Kw + k], acc);
  }
  if (act == 1) acc = acc / (1.f + expf(-acc));
  y[i] = acc;
}

struct Shape { int B, T, C, Kw, act, glu, has_bias, misalign; const char* layout; bool timed; };

int main() {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::vector<Shape> shapes = {
      {16, 249, 512, 31, 1, 1, 1, 0, "btc", true},   // Conformer M, the target
      {8, 3000, 512, 31, 1, 1, 1, 0, "btc", true},
      {16, 249, 256, 31, 1, 1, 1, 0, "btc", true},
      {16, 249, 1024, 31, 1, 1, 1, 0, "btc", true},
      {1, 7, 512, 31, 1, 1, 1, 0, "btc", true},
      {16, 250, 512, 31, 1, 1, 1, 0, "btc", true},
      {8, 3001, 512, 31, 1, 1, 1, 0, "btc", true},
      {1, 1, 512, 31, 1, 1, 1, 0, "btc", true},
      {16, 249, 512, 31, 0, 0, 0, 0, "btc", true},   // no GLU / act / bias
      {4, 100, 512, 7, 1, 1, 1, 0, "btc", false},
      {3, 37, 256, 3, 0, 1, 1, 0, "btc", false},
      {2, 37, 500, 31, 1, 1, 1, 0, "btc", false},   // C % 8 != 0: scalar path
      {2, 37, 512, 31, 1, 1, 1, 1, "btc", false},  // misaligned pointers: scalar path
      {16, 249, 512, 31, 1, 1, 1, 0, "bct", true},
      {8, 3000, 512, 31, 1, 1, 1, 0, "bct", true},
      {1, 7, 512, 31, 1, 1, 1, 0, "bct", true},
      {16, 249, 256, 31, 1, 1, 1, 0, "bct", false},
      {2, 37, 500, 31, 1, 1, 1, 0, "bct", false},
      {2, 37, 512, 7, 0, 0, 1, 1, "bct", false},
  };
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::mt19937 rng(1234);
  bool all_ok = true;
  for (const Shape& sh : shapes) {
    const int bct = !strcmp(sh.layout, "bct");
    const long long nx = (long long)sh.B * sh.T * sh.C * (sh.glu ? 2 : 1), ny = (long long)sh.B * sh.T * sh.C;
    std::uniform_real_distribution<float> ux(-2.f, 2.f), uw(-0.25f, 0.25f);
    std::vector<__half> hx(nx); for (auto& v : hx) v = __float2half(ux(rng));
    std::vector<float> hw((size_t)sh.C * sh.Kw), hb(sh.C);
    for (auto& v : hw) v = uw(rng);
    for (auto& v : hb) v = uw(rng);
    __half *dx_alloc, *dy_alloc; float *dw, *db, *dref;
    CK(cudaMalloc(&dx_alloc, (nx + 8) * 2)); CK(cudaMalloc(&dy_alloc, (ny + 8) * 2));
    CK(cudaMalloc(&dw, hw.size() * 4)); CK(cudaMalloc(&db, hb.size() * 4)); CK(cudaMalloc(&dref, ny * 4));
    __half* dx = dx_alloc + sh.misalign; __half* dy = dy_alloc + sh.misalign;
    CK(cudaMemcpy(dx, hx.data(), nx * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
    const float* dbias = sh.has_bias ? db : nullptr;
    ref_kernel<<<(ny + 255) / 256, 256>>>(dx, dw, dbias, dref, sh.B, sh.T, sh.C, sh.Kw, sh.act, sh.glu, bct);
    CK(cudaDeviceSynchronize());
    std::vector<float> href(ny); CK(cudaMemcpy(href.data(), dref, ny * 4, cudaMemcpyDeviceToHost));
    printf("\n== %s B=%d T=%d C=%d Kw=%d act=%d glu=%d bias=%d misalign=%d ==\n", sh.layout, sh.B, sh.T, sh.C, sh.Kw,
           sh.act, sh.glu, sh.has_bias, sh.misalign);
    double base_us = 0;
    for (const Variant& v : kVariants) {
      if (strcmp(v.layout, sh.layout)) continue;
      CK(cudaMemset(dy, 0xFF, ny * 2));  // NaN poison
      int rc = v.run(dx, dw, 1, dbias, 1, dy, sh.B, sh.T, sh.C, sh.Kw, sh.act, sh.glu, nullptr, 0, s);
      cudaError_t err = cudaStreamSynchronize(s);
      if (rc || err != cudaSuccess) { printf("  %-26s rc=%d err=%s\n", v.name, rc, cudaGetErrorString(err)); all_ok = false; continue; }
      std::vector<__half> hy(ny); CK(cudaMemcpy(hy.data(), dy, ny * 2, cudaMemcpyDeviceToHost));
      double maxd = 0; long long bad = 0;
      for (long long i = 0; i < ny; ++i) {
        float o = __half2float(hy[i]);
        double d = std::isfinite(o) ? fabs(o - href[i]) : INFINITY;
        maxd = std::max(maxd, d);
        if (!(d <= 2e-3 + 2e-3 * fabs(href[i]))) ++bad;
      }
      if (bad) all_ok = false;
      double med = -1;
      if (sh.timed) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int r = 0; r < 100; ++r) v.run(dx, dw, 1, dbias, 1, dy, sh.B, sh.T, sh.C, sh.Kw, sh.act, sh.glu, nullptr, 0, s);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
        std::vector<float> ts;
        for (int rep = 0; rep < 5; ++rep) {
          CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
          CK(cudaEventSynchronize(e1));
          float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms * 1000.f / 100.f);
        }
        std::sort(ts.begin(), ts.end()); med = ts[2];
        CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        if (!strncmp(v.name, "base_64x32_v8_n128", 18)) base_us = med;
      }
      printf("  %-26s maxdiff=%.3e bad=%lld %s  us=%8.2f  speedup=%5.2fx\n", v.name, maxd, bad, bad ? "FAIL" : "ok",
             med, (med > 0 && base_us > 0) ? base_us / med : 0.0);
    }
    CK(cudaFree(dx_alloc)); CK(cudaFree(dy_alloc)); CK(cudaFree(dw)); CK(cudaFree(db)); CK(cudaFree(dref));
  }
  printf("\nALL %s\n", all_ok ? "OK" : "FAILED");
  return all_ok ? 0 : 1;
}
