"""CUTLASS 3.x TMA warp-specialized fp16/bf16 GEMM (wgmma), sm90a only.

Ping-pong for 64-row tiles (one consumer warpgroup per tile, two tiles in flight), cooperative for 128+
rows, Stream-K (cooperative + Stream-K tile scheduler) for small-M deep-K shapes. Stage counts are the
builder's automatic carve-out after the epilogue's shared storage.
"""
from __future__ import annotations

from ...configs import Lane, parse

_SM90_IDS = (
    # small-M tiles
    "t64x32x64_c1x1_pp",
    "t64x64x64_c1x1_pp",
    "t64x128x64_c1x1_pp",
    "t64x256x64_c1x1_pp",
    "t64x64x64_c2x1_pp",
    "t64x128x64_c2x1_pp",
    "t64x128x64_c1x2_pp",
    # 128-row tiles, both schedules
    "t128x64x64_c1x1_pp",
    "t128x128x64_c1x1_pp",
    "t128x64x64_c1x1_coop",
    "t128x128x64_c1x1_coop",
    "t128x256x64_c1x1_coop",
    "t128x64x64_c2x1_coop",
    "t128x128x64_c2x1_coop",
    "t128x256x64_c2x1_coop",
    "t128x128x64_c1x2_coop",
    "t256x128x64_c2x1_coop",
    # Stream-K
    "t128x64x64_c1x1_sk",
    "t128x128x64_c1x1_sk",
)
SM90_SPACE = tuple(parse(i) for i in _SM90_IDS)
GEMM_DEFAULT = parse("t128x128x64_c2x1_coop")

SM90_F16_WGMMA = Lane(
    name="sm90_f16_wgmma",
    family="gemm",
    template="sm90_gemm.cu.j2",
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    space=SM90_SPACE,
    default=GEMM_DEFAULT,
    coverage_basis=(parse("t64x64x64_c1x1_pp"), parse("t64x128x64_c1x1_pp"), parse("t128x128x64_c1x1_sk")),
    smem_bytes={"sm90": 227 * 1024},
)


# ---- CUTLASS 2.x mma.sync fp16/bf16 GEMM (multistage, cp.async). Runs on sm80 and later.
# 
# Split-K is serial (semaphore-ordered) and a launch argument: `_k2` configs share their kernel with the
# unsplit one.

_SM80_IDS = (
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
SM80_SPACE = tuple(parse(i) for i in _SM80_IDS)
SM80_GEMM_DEFAULT = parse("b128x128x32_w64x64x32_s4")

SM80_F16_MMA = Lane(
    name="sm80_f16_mma",
    family="gemm",
    template="sm80_gemm.cu.j2",
    cuda_arch="80",
    arch_families=("sm80", "sm86", "sm87", "sm89", "sm90"),
    native_for=("sm80", "sm86", "sm87", "sm89"),
    space=SM80_SPACE,
    default=SM80_GEMM_DEFAULT,
    coverage_basis=(parse("b64x64x64_w32x32x64_s3"), parse("b64x64x64_w32x32x64_s3_k4")),
    smem_bytes={"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024},
)

LANES = (SM90_F16_WGMMA, SM80_F16_MMA)
