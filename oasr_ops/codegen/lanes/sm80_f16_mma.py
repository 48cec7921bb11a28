"""CUTLASS 2.x mma.sync fp16/bf16 GEMM (multistage, cp.async). Runs on sm80 and later.

Split-K is serial (semaphore-ordered) and a launch argument: `_k2` configs share their kernel with the
unsplit one.
"""
from __future__ import annotations

from ...configs import parse
from .base import Lane

_IDS = (
    "b128x128x32_w64x64x32_s4",
    "b128x256x32_w64x64x32_s3",
    "b256x128x32_w64x64x32_s3",
    "b128x64x32_w64x32x32_s4",
    "b64x128x32_w32x64x32_s4",
    "b64x64x32_w32x32x32_s5",
    "b64x64x64_w32x32x64_s3",
    "b32x64x64_w32x32x64_s4",
    "b64x64x64_w32x32x64_s3_k2",
    "b64x64x64_w32x32x64_s3_k4",
    "b128x128x32_w64x64x32_s4_k2",
    "b32x64x64_w32x32x64_s4_k4",
)
SPACE = tuple(parse(i) for i in _IDS)
GEMM_DEFAULT = parse("b128x128x32_w64x64x32_s4")

LANE = Lane(
    name="sm80_f16_mma",
    family="gemm",
    template="sm80_gemm.cu.j2",
    cuda_arch="80",
    arch_families=("sm80", "sm86", "sm87", "sm89", "sm90"),
    native_for=("sm80", "sm86", "sm87", "sm89"),
    space=SPACE,
    default=GEMM_DEFAULT,
    coverage_basis=(parse("b64x64x64_w32x32x64_s3"), parse("b64x64x64_w32x32x64_s3_k4")),
    smem_bytes={"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024},
)
