"""The depthwise conv1d lane: a Jinja-templated direct CUDA kernel (templates/conv1d_depthwise.cu.j2).

It is memory-bound (a few FMAs per byte at Kw <= 31 in fp32), so the config space is the data movement:
the tile of frames x channels a CTA stages in shared memory (with its Kw - 1 frame halo), the vector width of
its global loads/stores along the contiguous dim, and the CTA's thread count (which fixes the frames per
thread, R = T * C / threads, the register window each thread slides). Plain CUDA (no mma, no TMA, no
cp.async) — it runs on sm80 and every later family and is the native lane of all of them; like the sm80 GEMM
lane it is compiled for the family it runs on (`codegen.jit.target_arch`).

Ids: ``dw{T}x{C}_v{vec}_n{threads}`` (configs.py). ``v16`` moves 32 bytes (a full sector) per thread, meant
for the [B, C, T] layout (its load threads walk channels, one row each; measured slower than ``v8`` there on the
H200 all the same); ``v8`` is one 16-byte vector.
"""
from __future__ import annotations

from ...codegen.render_conv1d import LAYOUTS, dw_variant, split_dw_variant  # noqa: F401  (variant names)
from ...configs import Lane, parse

_IDS = (
    "dw16x64_v8_n128",    # short sequences (streaming chunks): more CTAs per frame
    "dw32x32_v4_n128",
    "dw32x64_v8_n256",
    "dw32x128_v8_n256",   # wide channel tiles: the [B, T, C] layout's rows
    "dw64x32_v8_n128",    # the default before the kernel's rewrite (fastest at 45 btc / 47 bct of 64 shapes then)
    "dw64x64_v8_n256",
    "dw64x32_v16_n128",   # 32-byte vectors: the [B, C, T] layout's rows
    "dw128x32_v8_n256",   # the lane default (docs/kernels.md, "The depthwise conv1d")
    "dw128x64_v8_n512",
    "dw256x32_v8_n512",   # a whole Conformer utterance (T <= 256) per CTA: fastest at B=16, T=249, C=512
)
SPACE = tuple(parse(i) for i in _IDS)
# The lane default: the fastest or within 4 % of it at every [B, T, C] shape of the microbenchmark with 2000+ frames
# (B=16 T=249 C=256/512/1024, B=8 T=3000, with and without GLU; single sequences of T = 1, 7: 2.5 us vs 2.1 for the
# smaller tiles) and the fastest of the [B, C, T] configs measured; see docs/kernels.md. It replaces
# dw128x32_v16_n256 in the space: 32-byte vectors measured slower than 16-byte ones for [B, C, T] (64x32 tiles).
DWCONV_DEFAULT = parse("dw128x32_v8_n256")
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
