"""CUTLASS 2.x mma.sync int8 W8A8 GEMM (multistage, cp.async, m16n8k32 IMMA) with a row x column scale
epilogue visitor tree (Sm80 EVT). Runs on sm80 and later; native lane of sm80/sm86/sm87/sm89.

The epilogue is CUTLASS's 2.x EVT from stock visitors (`VisitorColBroadcast` scale_a by m,
`VisitorRowBroadcast` scale_w by n, `VisitorAccFetch`, `VisitorCompute`, `VisitorAuxStore`), emitted around
`DefaultGemmWithVisitor` by `codegen/emit_int8.py` (cutlass_library's own 2.x emitter has no visitor kernel).

Decisions:
* scale_a's broadcast has a run-time stride (0 = per tensor, 1 = per token); the 2.x row broadcast loads
  128-bit vectors and cannot take a stride of 0, so a per-tensor scale_w is expanded to `[N]` by the op
  (one tiny copy per call; `QuantLinear` always holds per-channel scales).
* sm80's int8 mma.sync exists only as `.satfinite`: the int32 accumulator saturates where wgmma / `_int_mm`
  wrap. The two agree whenever the exact sum fits in int32, i.e. always for K < 131072 (|q| <= 128).
* No split-K (the Sm80 EVT kernel does not support serial split-K) and no Stream-K in this lane.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...configs import Config, Lane, parse

# int8 operands are read as 128-bit vectors: K must be a multiple of 16 elements (both operands are K-major).
OPERAND_ALIGN = 16
# fp16/bf16 output rows are written as 128-bit vectors (8 elements): N % 8 == 0. int8 output (the quantizing op)
# is written 16 at a time: N % 16 == 0 for that op.
OUTPUT_ALIGN = 8


@dataclass(frozen=True)
class Int8Lane(Lane):
    """A scaled_mm lane: one-byte operands, K % 16 and N % 8 feasibility, Stream-K for measured entries only."""

    operand_bytes: int = 1

    def infeasible_reason(self, c: Config, *, m: int | None = None, n: int | None = None,
                          k: int | None = None, arch_family: str | None = None) -> str | None:
        why = super().infeasible_reason(c, m=m, n=n, k=k, arch_family=arch_family)
        if why is not None:
            return why
        if k is not None and k % OPERAND_ALIGN:
            return f"K={k} not a multiple of {OPERAND_ALIGN} (int8 operands are read 16 at a time)"
        if n is not None and n % OUTPUT_ALIGN:
            return f"N={n} not a multiple of {OUTPUT_ALIGN}"
        return None

    def data_parallel(self) -> tuple[Config, ...]:
        return tuple(c for c in self.space if c.kernel_schedule != "streamk")


_SM80_IDS = (
    "b128x128x64_w64x64x64_s3",
    "b128x256x64_w64x64x64_s3",
    "b256x128x64_w64x64x64_s3",
    "b128x64x64_w64x32x64_s4",
    "b64x128x64_w32x64x64_s4",
    "b64x64x64_w32x32x64_s5",
    "b64x64x128_w32x32x128_s3",
    "b32x64x128_w32x32x128_s4",
)
SM80_SPACE = tuple(parse(i) for i in _SM80_IDS)
SM80_SCALED_MM_DEFAULT = parse("b128x128x64_w64x64x64_s3")

SM80_INT8_MMA = Int8Lane(
    name="sm80_int8_mma",
    family="scaled_mm",
    template="sm80_scaled_mm.cu.j2",
    cuda_arch="80",
    arch_families=("sm80", "sm86", "sm87", "sm89", "sm90"),
    native_for=("sm80", "sm86", "sm87", "sm89"),
    space=SM80_SPACE,
    default=SM80_SCALED_MM_DEFAULT,
    coverage_basis=(parse("b64x64x128_w32x32x128_s3"),),
    smem_bytes={"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024},
)


# ---- CUTLASS 3.x TMA warp-specialized int8 W8A8 GEMM (wgmma s8 x s8 -> s32, IGMMA), sm90a only.
# 
# The epilogue is a visitor tree of stock pieces: an fp32 `Sm90ColBroadcast` of scale_a
# (indexed by m) times [an fp32 `Sm90RowBroadcast` of scale_w (indexed by n) times the int32 accumulator], plus an
# optional bias row, rounded once to fp16/bf16 (or divided by out_scale, rounded and saturated to int8 for the
# quantizing op). The broadcasts take `bool` strides, so per-tensor and per-token/per-channel scales share one
# kernel; broadcast loads use alignment 1 (no over-read of a partial M tile).
# 
# The set is nine tiles, tile K = 128 (two 64-byte K-slabs per stage, the int8 analogue of fp16's K = 64):
# 
# * seven data-parallel: 64-row ping-pong tiles for small M (64x64, 64x128, 64x256: one consumer warpgroup per
#   tile, two tiles in flight), 128-row tiles for large M (128x64 / 128x128 / 128x256 cooperative; 128x128
#   ping-pong with a 2x1 cluster, vLLM's large-M choice, which multicasts the weight tile across the pair);
# * two Stream-K (cooperative + Stream-K scheduler), 128x64 and 128x128, for few output tiles over a deep K.
#   Stream-K partials are reduced in the accumulator type (int32), so they are exact: every tile computes the same
#   bits. Only a measured DB entry may pick them (the heuristic never does), and the quantizing op never serves them
#   (the quantizing epilogue has no Stream-K launcher: `select_quant_config` skips such entries).

_SM90_IDS = (
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
SM90_SPACE = tuple(parse(i) for i in _SM90_IDS)
SM90_SCALED_MM_DEFAULT = parse("t128x128x128_c2x1_pp")

SM90_INT8_WGMMA = Int8Lane(
    name="sm90_int8_wgmma",
    family="scaled_mm",
    template="sm90_scaled_mm.cu.j2",
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    space=SM90_SPACE,
    default=SM90_SCALED_MM_DEFAULT,
    coverage_basis=(parse("t64x64x128_c1x1_pp"), parse("t128x128x128_c1x1_sk")),
    smem_bytes={"sm90": 227 * 1024},
)

LANES = (SM80_INT8_MMA, SM90_INT8_WGMMA)
