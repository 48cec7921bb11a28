"""The fp8 e4m3 W8A8 family's lanes: ``sm90_fp8_wgmma`` (CUTLASS 3.x, native on sm90) and ``sm89_fp8_mma``
(CUTLASS 2.x mma.sync, native on sm89; built and ABI-checked on the CPU, it cannot run on an H200).

The epilogue is the int8 family's visitor tree (vLLM's ScaledEpilogue: a column broadcast of scale_a times a
row broadcast of scale_w times the fp32 accumulator, plus an optional bias row, rounded once), so every tile
computes ``scale_a * (scale_w * acc) (+ bias)`` with the same fp32 roundings. What differs between tiles is the
accumulator ``acc`` itself: fp8 products are summed in fp32 by the tensor cores, so the *summation order* decides
the bits (`summation_order`):

* non-FastAccum (CUTLASS's FP8 mainloop ``GmmaFP8Accumulation``): wgmma accumulates `promotion span` elements of
  K (the launcher passes ``mma_promotion_interval = tile K / 32`` k-blocks: one promotion per K tile) into a
  temporary accumulator that is then added to the full-fp32 one. Tiles sharing the span compute the same bits.
* FastAccum (``*FP8FastAccum`` schedules): wgmma accumulates along the whole of K in its own accumulator (which
  keeps ~13-14 mantissa bits of the running sum, not 24): one order for every such tile.
* Stream-K: partial sums of K ranges reduced in fp32 in an order that depends on the problem's split: each
  Stream-K config is an order of its own.
* swap-AB (``_swab``): the kernel computes ``D^T = W . A^T`` (A = W [N, K], B = the activations [M, K], D written
  column-major, i.e. the row-major [M, N] output); scale_w becomes the column broadcast and scale_a the row one
  (the multiplication order ``scale_a * (scale_w * acc)`` is kept). The dot products are the same, but nothing
  guarantees the tensor core's reduction inside one instruction is symmetric in its operands, so swapped tiles are
  their own order groups (the GPU suite reports whether they happen to match).

Tiles of one order group are gated bitwise against each other; across groups (and for ``torch``, which runs
torch._scaled_mm) the gate is a tolerance: within 4x of cuBLAS's own error against a float64 reference.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...configs import Config, Lane, parse

# fp8 operands are read as 128-bit vectors (16 elements), K-major: K % 16 == 0. Outputs are written 128 bits at a
# time (8 fp16/bf16, 16 fp8) and torch._scaled_mm (the `torch` arm) needs N % 16: N % 16 == 0 for both ops.
OPERAND_ALIGN = 16
OUTPUT_ALIGN = 16


@dataclass(frozen=True)
class Fp8Lane(Lane):
    """A scaled_mm_fp8 lane: one-byte operands, K % 16 and N % 16 feasibility."""

    operand_bytes: int = 1

    def infeasible_reason(self, c: Config, *, m: int | None = None, n: int | None = None,
                          k: int | None = None, arch_family: str | None = None, dtype: str | None = None
                          ) -> str | None:
        why = super().infeasible_reason(c, m=m, n=n, k=k, arch_family=arch_family)
        if why is not None:
            return why
        if k is not None and k % OPERAND_ALIGN:
            return f"K={k} not a multiple of {OPERAND_ALIGN} (fp8 operands are read 16 at a time)"
        if n is not None and n % OUTPUT_ALIGN:
            return f"N={n} not a multiple of {OUTPUT_ALIGN}"
        return None

    def data_parallel(self) -> tuple[Config, ...]:
        return tuple(c for c in self.space if c.kernel_schedule != "streamk")


def promotion_interval(c: Config) -> int:
    """The non-FastAccum mainloop's ``mma_promotion_interval`` (k-blocks of 32 between promotions to the fp32
    accumulator): one K tile (CUTLASS requires a multiple of 4 that the k-blocks per tile divide). The rendered
    kernel sets the same value (`codegen.emit_fp8.promotion_interval`; codegen imports no family)."""
    kb = c.tile[2] // 32
    return max(4, -(-kb // 4) * 4)


def summation_order(c: Config) -> str:
    """The order group of a config: configs with equal groups compute the same bits (module docstring)."""
    if c.generation == "2x":
        return "mma_sync"  # sm89: mma.sync k=32 steps accumulated in fp32 registers, in K order
    acc = "fast" if c.fast_accum else f"promote{promotion_interval(c) * 32}"
    if c.kernel_schedule == "streamk":
        return f"{acc}|streamk|{c.id}"
    return f"{acc}|swab" if c.swap_ab else acc


# ---- CUTLASS 3.x TMA warp-specialized fp8 e4m3 GEMM (wgmma e4m3 x e4m3 -> f32), sm90a only.
# Tile K = 128 (128 bytes, one 128-byte swizzle atom per row), 256 for the swap-AB tiles (vLLM's small-M choice:
# few K iterations matter most when the whole GEMM is a handful of CTAs). Seventeen configs:
# * non-FastAccum data-parallel: 64-row ping-pong 64x64 / 64x128, 128-row 128x128 cooperative, 128x128 2x1-cluster
#   ping-pong (vLLM's M > 128 tile, with the weight tile multicast over the pair), 128x256 cooperative;
#   swap-AB 64x16x256 / 64x64x256 ping-pong (vLLM's M <= 64 tiles);
# * FastAccum data-parallel: 64x128 ping-pong (vLLM's M 65..128 tile), 128x128 2x1 ping-pong, 128x256
#   cooperative, swap-AB 64x16x256 / 64x64x256;
# * Stream-K (cooperative + Stream-K scheduler) 128x128, with and without FastAccum: only a measured entry picks
#   them (they can win at deep K with few output tiles);
# * added after the H200 probe (benchmarks/scaled_mm_fp8_probe.py, docs/perf/scaled_mm_fp8.md): FastAccum 128x128
#   ping-pong with the cluster along N (1x2: the A tile multicast; best at 8 of 18 ASR shapes with M >= 4096, up
#   to 1.10x the lane's best tile), the 2x1 one with a swizzle of 8 and 128x256 cooperative with a swizzle of 8
#   (1260 / 1277 TFLOP/s at 8192^3 against the unswizzled tiles' 1042 / 1178).
_SM90_IDS = (
    "t64x64x128_c1x1_pp",
    "t64x128x128_c1x1_pp",
    "t128x128x128_c1x1_coop",
    "t128x128x128_c2x1_pp",
    "t128x256x128_c1x1_coop",
    "t64x16x256_c1x1_pp_swab",
    "t64x64x256_c1x1_pp_swab",
    "t64x128x128_c1x1_pp_fa",
    "t128x128x128_c2x1_pp_fa",
    "t128x256x128_c1x1_coop_fa",
    "t64x16x256_c1x1_pp_fa_swab",
    "t64x64x256_c1x1_pp_fa_swab",
    "t128x128x128_c1x1_sk",
    "t128x128x128_c1x1_sk_fa",
    "t128x128x128_c1x2_pp_fa",
    "t128x128x128_c2x1_pp_z8_fa",
    "t128x256x128_c1x1_coop_z8_fa",
)
SM90_SPACE = tuple(parse(i) for i in _SM90_IDS)

# Candidates: configs timed by benchmarks/scaled_mm_fp8_probe.py against the lane's best tiles and torch._scaled_mm
# and checked by the GPU suite, not in the lane yet (not served, not measured by the build); the winners move into
# _SM90_IDS. None pending. Tried on the H200 and left out (docs/perf/scaled_mm_fp8.md, "Candidate tiles"):
# 128x256 cooperative FastAccum cluster 2x1 +/- swizzle 8 (the swizzled one 1268 TFLOP/s at 8192^3, below the
# 1x1 swizzled tile), 256x128 cooperative FastAccum 1x2 +/- swizzle (<= 1242, never best at ASR shapes), 128x128
# cooperative FastAccum (never within 2 % of the best), and full accumulation with a 256-deep K tile (promotion
# every 256 elements: 0.69x the lane's best tile geomean, slower than the 128-deep promoting tile).
_SM90_CANDIDATE_IDS: tuple[str, ...] = ()
SM90_CANDIDATES = tuple(parse(i) for i in _SM90_CANDIDATE_IDS)
SM90_DEFAULT = parse("t128x128x128_c2x1_pp")

SM90_FP8_WGMMA = Fp8Lane(
    name="sm90_fp8_wgmma",
    family="scaled_mm_fp8",
    template="sm90_scaled_mm_fp8.cu.j2",
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    space=SM90_SPACE,
    default=SM90_DEFAULT,
    coverage_basis=(parse("t64x16x256_c1x1_pp_swab"), parse("t128x128x128_c1x1_sk")),
    smem_bytes={"sm90": 227 * 1024},
)

# ---- CUTLASS 2.x mma.sync fp8 e4m3 GEMM (m16n8k32, fp32 accumulation), sm89 (Ada). One summation order (K
# steps of 32 accumulated in fp32 registers, in K order). No Stream-K, no split-K.
_SM89_IDS = (
    "b128x128x64_w64x64x64_s3",
    "b128x64x64_w64x32x64_s4",
    "b64x128x64_w32x64x64_s4",
    "b64x64x64_w32x32x64_s5",
    "b64x64x128_w32x32x128_s3",
    "b32x64x128_w32x32x128_s4",
)
SM89_SPACE = tuple(parse(i) for i in _SM89_IDS)

SM89_FP8_MMA = Fp8Lane(
    name="sm89_fp8_mma",
    family="scaled_mm_fp8",
    template="sm89_scaled_mm_fp8.cu.j2",
    cuda_arch="89",
    arch_families=("sm89",),
    native_for=("sm89",),
    space=SM89_SPACE,
    default=parse("b128x128x64_w64x64x64_s3"),
    coverage_basis=(parse("b32x64x128_w32x32x128_s4"),),
    smem_bytes={"sm89": 99 * 1024},
)

LANES = (SM89_FP8_MMA, SM90_FP8_WGMMA)


def sm90_with_candidates() -> Fp8Lane:
    """The sm90 lane with the candidates added to its space: what the probe benchmark and the GPU suite compile
    and run (not registered: the runtime never serves a candidate)."""
    from dataclasses import replace

    return replace(SM90_FP8_WGMMA, space=SM90_SPACE + tuple(c for c in SM90_CANDIDATES if c not in SM90_SPACE))
