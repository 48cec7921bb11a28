// A probe, not a served kernel: how fast does an int8 tensor-core (wgmma) implicit-GEMM conv run the Conformer
// frontend's second conv (Conv2d(d, d, 3, stride 2), NHWC) on sm90, against the cuDNN fp16 kernel the e2e profiles
// spend ~436 us in? CUTLASS 3.x conv collective (TMA im2col), int8 x int8 -> int32, epilogue
// D = fp16(ReLU(alpha * acc + bias[k])): one scalar alpha (the production epilogue would scale per output channel).
// One tile config per build, selected by -DPROBE_TILE_M/N and -DPROBE_CLUSTER_M.
#include <cstdint>
#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"

using namespace cute;

#ifndef PROBE_TILE_M
#define PROBE_TILE_M 128
#endif
#ifndef PROBE_TILE_N
#define PROBE_TILE_N 128
#endif
#ifndef PROBE_CLUSTER_M
#define PROBE_CLUSTER_M 1
#endif

namespace {

using ElementAct = int8_t;
using ElementFlt = int8_t;
using ElementAcc = int32_t;
using ElementOut = cutlass::half_t;
using TileShape = Shape<Int<PROBE_TILE_M>, Int<PROBE_TILE_N>, Shape<_128>>;
using ClusterShape = Shape<Int<PROBE_CLUSTER_M>, _1, _1>;
// CUTLASS 4.2's sm90 conv supports only the non-persistent warp-specialized schedule (dispatch_policy.hpp:
// "Persistent schedules not support for conv yet"): one CTA per output tile, TileM / 64 consumer warpgroups.
using MainloopSchedule = cutlass::conv::KernelImplicitTmaWarpSpecializedSm90;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
    cutlass::epilogue::thread::ReLu, ElementOut, float, ElementOut, void, float>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float,
    void, cutlass::layout::TensorNHWC, 8,
    ElementOut, cutlass::layout::TensorNHWC, 8,
    EpilogueSchedule, Fusion>::CollectiveOp;

using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
    ElementAct, cutlass::layout::TensorNHWC, 16,
    ElementFlt, cutlass::layout::TensorNHWC, 16,
    ElementAcc, TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;

using ProblemShape = cutlass::conv::ConvProblemShape<CollectiveMainloop::DispatchPolicy::ConvOp,
                                                     CollectiveMainloop::DispatchPolicy::NumSpatialDimensions>;
using ConvKernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Conv = cutlass::conv::device::ConvUniversalAdapter<ConvKernel>;

bool make_args(typename Conv::Arguments& args, const int8_t* x, const int8_t* w, const void* bias, void* out,
               int n, int h, int wd, int c, int k, int r, int s, int stride_h, int stride_w, int pad_h, int pad_w,
               float alpha) {
  ProblemShape ps(cutlass::conv::Mode::kCrossCorrelation,
                  {n, h, wd, c}, {int64_t(h) * wd * c, int64_t(wd) * c, c, 1},
                  {k, r, s, c}, {int64_t(r) * s * c, int64_t(s) * c, c, 1},
                  {pad_h, pad_w}, {pad_h, pad_w}, {stride_h, stride_w}, {1, 1}, 1);
  typename ConvKernel::StrideC stride_c{};
  typename ConvKernel::StrideD stride_d{};
  cute::for_each(cute::make_seq<cute::rank<0>(typename ConvKernel::StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride_d) = ps.stride_C[ProblemShape::RankT - 2 - i];
    cute::get<0, i>(stride_c) = ps.stride_C[ProblemShape::RankT - 2 - i];
  });
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = ps;
  args.mainloop.ptr_A = x;
  args.mainloop.ptr_B = w;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = stride_c;
  args.epilogue.ptr_D = static_cast<ElementOut*>(out);
  args.epilogue.dD = stride_d;
  args.epilogue.thread.alpha = alpha;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.thread.bias_ptr = static_cast<const ElementOut*>(bias);
  int dev = 0;
  cudaGetDevice(&dev);
  args.hw_info.device_id = dev;
  args.hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(dev);
  return true;
}

}  // namespace

#define PROBE_API __attribute__((visibility("default")))  // built with -fvisibility=hidden

extern "C" {

// 0: can run; 1: CUTLASS refuses the problem (can_implement)
PROBE_API int probe_can_implement(int n, int h, int wd, int c, int k, int r, int s, int sh, int sw, int ph, int pw) {
  typename Conv::Arguments args{};
  make_args(args, nullptr, nullptr, nullptr, nullptr, n, h, wd, c, k, r, s, sh, sw, ph, pw, 1.f);
  return Conv::can_implement(args) == cutlass::Status::kSuccess ? 0 : 1;
}

PROBE_API size_t probe_workspace_size(int n, int h, int wd, int c, int k, int r, int s, int sh, int sw, int ph, int pw) {
  typename Conv::Arguments args{};
  make_args(args, nullptr, nullptr, nullptr, nullptr, n, h, wd, c, k, r, s, sh, sw, ph, pw, 1.f);
  return Conv::get_workspace_size(args);
}

// x [n, h, w, c] int8, w [k, r, s, c] int8, bias [k] fp16, out [n, p, q, k] fp16. Returns a cutlass::Status.
PROBE_API int probe_run(const int8_t* x, const int8_t* w, const void* bias, void* out, int n, int h, int wd, int c, int k,
              int r, int s, int sh, int sw, int ph, int pw, float alpha, void* workspace, cudaStream_t stream) {
  typename Conv::Arguments args{};
  make_args(args, x, w, bias, out, n, h, wd, c, k, r, s, sh, sw, ph, pw, alpha);
  Conv op;
  cutlass::Status st = op.initialize(args, workspace, stream);
  if (st != cutlass::Status::kSuccess) return int(st);
  return int(op.run(stream));
}

PROBE_API int probe_smem_bytes() { return int(ConvKernel::SharedStorageSize); }

}  // extern "C"
