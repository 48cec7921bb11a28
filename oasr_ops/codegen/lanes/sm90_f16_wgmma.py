"""CUTLASS 3.x TMA warp-specialized fp16/bf16 GEMM (wgmma), sm90a only.

Ping-pong for 64-row tiles (one consumer warpgroup per tile, two tiles in flight), cooperative for 128+
rows, Stream-K (cooperative + Stream-K tile scheduler) for small-M deep-K shapes. Stage counts are the
builder's automatic carve-out after the epilogue's shared storage.
"""
from __future__ import annotations

from ...configs import parse
from .base import Lane

_IDS = (
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
SPACE = tuple(parse(i) for i in _IDS)
GEMM_DEFAULT = parse("t128x128x64_c2x1_coop")

LANE = Lane(
    name="sm90_f16_wgmma",
    family="gemm",
    template="sm90_gemm.cu.j2",
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    space=SPACE,
    default=GEMM_DEFAULT,
    coverage_basis=(parse("t64x64x64_c1x1_pp"), parse("t64x128x64_c1x1_pp"), parse("t128x128x64_c1x1_sk")),
    smem_bytes={"sm90": 227 * 1024},
)
