"""The conv2d_activation lane: one config space with two kernel generations (codegen/render_conv2d.py).

* ``dc{P}x{C}_v{vec}_n{threads}``: the direct conv for K = Cin * KH * KW <= 196 (`configs.DC_MAX_K`; the untuned
  rule uses it up to K = 36). Write-bound: the tile sets how many output rows a CTA stores and how wide each
  thread's vector store is (v8 = 16 bytes).
* ``b{M}x{N}x{K}_w{..}_s{stages}``: CUTLASS 2.x implicit-GEMM fprop (mma.sync, sm80 instructions, compiled for
  the family it runs on, as the sm80 GEMM lane: `codegen.jit.target_arch`), Cin and Cout multiples of 8.
  CUTLASS 3.x's sm90 TMA conv (``KernelImplicitTmaWarpSpecializedSm90``) is not used yet: docs/kernels.md says why.

A config the problem cannot use is statically infeasible (`Lane.infeasible_reason`: a direct config for K > 196,
an implicit-GEMM one for K or N not a multiple of 8), so tuning and the untuned rule never offer it.
"""
from __future__ import annotations

from ...codegen.render_conv2d import FPROP_TEMPLATE
from ...configs import Lane, parse

_DIRECT = (
    "dc64x128_v8_n256",   # the lane default: 4 positions x 16-byte vectors per thread
    "dc32x128_v8_n256",   # more CTAs (short inputs)
    "dc128x128_v8_n256",  # 8 positions per thread: the weights' smem reads amortised over more outputs
    "dc32x256_v8_n256",   # wide channel tiles: Cout 256+
    "dc16x512_v8_n256",   # one CTA covers Cout = 512 (each input patch staged once)
)
_IMPLICIT_GEMM = (
    "b128x128x64_w64x64x64_s3",   # the coverage basis tile (4 warps)
    "b128x256x64_w64x64x64_s3",   # 8 warps, wide N (Cout 256+)
    "b256x128x64_w64x64x64_s3",   # 8 warps, tall M (M = B * Ho * Wo is large)
    "b128x128x32_w64x64x32_s4",   # shorter K step, deeper pipeline
    "b64x128x64_w32x64x64_s4",    # small M tiles: more CTAs for short inputs
)
SPACE = tuple(parse(i) for i in _DIRECT + _IMPLICIT_GEMM)
DIRECT_DEFAULT = parse("dc64x128_v8_n256")
_ARCHS = ("sm80", "sm86", "sm87", "sm89", "sm90")

SM80_F16_CONV2D = Lane(
    name="sm80_f16_conv2d",
    family="conv2d_activation",
    template=FPROP_TEMPLATE,  # the implicit-GEMM configs'; the direct ones use conv2d_direct.cu.j2
    cuda_arch="80",
    arch_families=_ARCHS,
    native_for=_ARCHS,
    space=SPACE,
    default=DIRECT_DEFAULT,
    coverage_basis=(parse("b128x128x64_w64x64x64_s3"),),
    smem_bytes={"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024},
)

LANES = (SM80_F16_CONV2D,)
