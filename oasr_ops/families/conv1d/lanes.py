"""The depthwise conv1d lane: a Jinja-templated direct CUDA kernel (templates/conv1d_depthwise.cu.j2).

It is memory-bound (a few FMAs per byte at Kw <= 31 in fp32), so the config space is the data movement:
the tile of frames x channels a CTA stages in shared memory (with its Kw - 1 frame halo), the vector width of
its global loads/stores along the contiguous dim, and the CTA's thread count (which fixes the frames per
thread, R = T * C / threads, the register window each thread slides). Plain CUDA (no mma, no TMA, no
cp.async) — it runs on sm80 and every later family and is the native lane of all of them; like the sm80 GEMM
lane it is compiled for the family it runs on (`codegen.jit.target_arch`).

Ids: ``dw{T}x{C}_v{vec}_n{threads}`` (configs.py). ``v16`` moves 32 bytes (a full sector) per thread, which
the [B, C, T] layout wants (its load threads walk channels, one row each); ``v8`` is one 16-byte vector.
"""
from __future__ import annotations

from ...codegen.render_conv1d import LAYOUTS, dw_variant, split_dw_variant  # noqa: F401  (variant names)
from ...configs import Lane, parse

_IDS = (
    "dw16x64_v8_n128",    # short sequences (streaming chunks): more CTAs per frame
    "dw32x32_v4_n128",
    "dw32x64_v8_n256",
    "dw32x128_v8_n256",   # wide channel tiles: the [B, T, C] layout's rows
    "dw64x32_v8_n128",    # the lane default: fastest at 45 (btc) and 47 (bct) of 64 shapes on the H200, docs/perf/conv.md
    "dw64x64_v8_n256",
    "dw64x32_v16_n128",   # 32-byte vectors: the [B, C, T] layout's rows
    "dw128x32_v16_n256",
    "dw128x64_v8_n512",
)
SPACE = tuple(parse(i) for i in _IDS)
DWCONV_DEFAULT = parse("dw64x32_v8_n128")
_ARCHS = ("sm80", "sm86", "sm87", "sm89", "sm90")

SM80_F16_DWCONV = Lane(
    name="sm80_f16_dwconv",
    family="conv1d",
    template="conv1d_depthwise.cu.j2",
    cuda_arch="80",
    arch_families=_ARCHS,
    native_for=_ARCHS,
    space=SPACE,
    default=DWCONV_DEFAULT,
    coverage_basis=(parse("dw32x64_v8_n256"), parse("dw64x32_v16_n128")),
    smem_bytes={"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024},
)

LANES = (SM80_F16_DWCONV,)
