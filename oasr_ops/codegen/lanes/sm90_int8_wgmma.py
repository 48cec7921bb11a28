"""CUTLASS 3.x TMA warp-specialized int8 W8A8 GEMM (wgmma s8 x s8 -> s32, IGMMA), sm90a only.

The epilogue is a visitor tree of stock pieces (notes/cutlass.md): an fp32 `Sm90ColBroadcast` of scale_a
(indexed by m) times [an fp32 `Sm90RowBroadcast` of scale_w (indexed by n) times the int32 accumulator], plus an
optional bias row, rounded once to fp16/bf16 (or divided by out_scale, rounded and saturated to int8 for the
quantizing op). The broadcasts take `bool` strides, so per-tensor and per-token/per-channel scales share one
kernel; broadcast loads use alignment 1 (no over-read of a partial M tile).

The set is nine tiles, tile K = 128 (two 64-byte K-slabs per stage, the int8 analogue of fp16's K = 64):

* seven data-parallel: 64-row ping-pong tiles for small M (64x64, 64x128, 64x256: one consumer warpgroup per
  tile, two tiles in flight), 128-row tiles for large M (128x64 / 128x128 / 128x256 cooperative; 128x128
  ping-pong with a 2x1 cluster, vLLM's large-M choice, which multicasts the weight tile across the pair);
* two Stream-K (cooperative + Stream-K scheduler), 128x64 and 128x128, for few output tiles over a deep K.
  Stream-K partials are reduced in the accumulator type (int32), so they are exact: every tile computes the same
  bits. Only a measured DB entry may pick them (the heuristic never does), and the quantizing op never serves them
  (the quantizing epilogue has no Stream-K launcher: `select_quant_config` skips such entries).
"""
from __future__ import annotations

from ...configs import parse
from .sm80_int8_mma import Int8Lane

_IDS = (
    # data-parallel
    "t64x64x128_c1x1_pp",
    "t64x128x128_c1x1_pp",
    "t64x256x128_c1x1_pp",
    "t128x64x128_c1x1_coop",
    "t128x128x128_c1x1_coop",
    "t128x128x128_c2x1_pp",
    "t128x256x128_c1x1_coop",
    # Stream-K
    "t128x64x128_c1x1_sk",
    "t128x128x128_c1x1_sk",
)
SPACE = tuple(parse(i) for i in _IDS)
SCALED_MM_DEFAULT = parse("t128x128x128_c2x1_pp")

LANE = Int8Lane(
    name="sm90_int8_wgmma",
    family="scaled_mm",
    template="sm90_scaled_mm.cu.j2",
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    space=SPACE,
    default=SCALED_MM_DEFAULT,
    coverage_basis=(parse("t64x64x128_c1x1_pp"), parse("t128x128x128_c1x1_sk")),
    smem_bytes={"sm90": 227 * 1024},
)
