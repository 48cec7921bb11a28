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

from ...configs import Config, parse
from .base import Lane

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


_IDS = (
    "b128x128x64_w64x64x64_s3",
    "b128x256x64_w64x64x64_s3",
    "b256x128x64_w64x64x64_s3",
    "b128x64x64_w64x32x64_s4",
    "b64x128x64_w32x64x64_s4",
    "b64x64x64_w32x32x64_s5",
    "b64x64x128_w32x32x128_s3",
    "b32x64x128_w32x32x128_s4",
)
SPACE = tuple(parse(i) for i in _IDS)
SCALED_MM_DEFAULT = parse("b128x128x64_w64x64x64_s3")

LANE = Int8Lane(
    name="sm80_int8_mma",
    family="scaled_mm",
    template="sm80_scaled_mm.cu.j2",
    cuda_arch="80",
    arch_families=("sm80", "sm86", "sm87", "sm89", "sm90"),
    native_for=("sm80", "sm86", "sm87", "sm89"),
    space=SPACE,
    default=SCALED_MM_DEFAULT,
    coverage_basis=(parse("b64x64x128_w32x32x128_s3"),),
    smem_bytes={"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024},
)
