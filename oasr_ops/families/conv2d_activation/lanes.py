"""The conv2d_activation lanes: one config space per lane with up to three kernel generations
(codegen/render_conv2d.py), all behind one C launcher.

* ``dc{P}x{C}_v{vec}_n{threads}``: the direct conv for K = Cin * KH * KW <= 196 (`configs.DC_MAX_K`; the untuned
  rule uses it up to K = 36). Write-bound: the tile sets how many output rows a CTA stores and how wide each
  thread's vector store is (v8 = 16 bytes).
* ``b{M}x{N}x{K}_w{..}_s{stages}``: CUTLASS 2.x implicit-GEMM fprop (mma.sync, cp.async multistage), Cin and Cout
  multiples of 8.
* ``t{M}x{N}x{K}_c{CM}x{CN}_ws`` (sm90 lane only): CUTLASS 3.x implicit-GEMM fprop — TMA im2col loads (any
  traversal stride), wgmma, the non-persistent warp-specialized kernel (CUTLASS 4.2 supports no persistent
  schedule for conv: `MainloopSm90TmaGmmaWarpSpecializedImplicitGemm` asserts it), bias + activation as the sm90
  GEMM lane's EVT. One consumer warpgroup: at most 128 x 128 accumulators per tile.

`sm90_f16_conv2d` (nvcc 90a, native on sm90) holds the direct and 3.x configs; `sm80_f16_conv2d` (sm80 SASS
compiled for the family it runs on, native on sm80..sm89) the direct and 2.x ones. A config the problem cannot use is statically infeasible
(`Lane.infeasible_reason`: a direct config for K > 196, an implicit-GEMM one for K or N not a multiple of 8), so
tuning and the untuned rule never offer it. The space is kept small (10 configs x 2 dtypes on sm90) so a prebuild
stays under 24 kernels.
"""
from __future__ import annotations

from ...codegen.render_conv2d import FPROP_TEMPLATE, SM90_FPROP_TEMPLATE
from ...configs import Lane, parse

_DIRECT = (
    "dc128x128_v8_n256",  # the lane default: 8 positions per thread; fastest at all 12 frontend shapes on the H200
    "dc64x128_v8_n256",   # 4 positions x 16-byte vectors per thread (more CTAs)
    "dc32x256_v8_n256",   # wide channel tiles: Cout 256+, 8 positions per thread
    "dc16x512_v8_n256",   # one CTA covers Cout = 512 (each input patch staged once)
    "dc256x128_v8_n128",  # 256 positions x 128 channels per CTA: the untuned rule's tile for large frontends
)
_IMPLICIT_GEMM_2X = (
    "b128x128x64_w64x64x64_s3",   # the sm80 lane's coverage basis tile (4 warps)
    "b128x256x64_w64x64x64_s3",   # 8 warps, wide N (Cout 256+)
    "b64x128x64_w32x64x64_s4",    # small M tiles: more CTAs for short inputs
)
_IMPLICIT_GEMM_3X = (
    "t128x128x64_c1x1_ws",   # the sm90 lane's coverage basis tile
    "t128x128x64_c2x1_ws",   # 2-CTA cluster along M: the filter tile multicast
    "t128x128x64_c1x2_ws",   # 2-CTA cluster along N: the im2col activation tile multicast
    "t64x256x64_c1x1_ws",    # wide N (Cout 256+)
    "t64x128x64_c1x1_ws",    # small tiles: more CTAs for short inputs
)
DIRECT_DEFAULT = parse("dc128x128_v8_n256")  # docs/perf/conv.md: 4.6-5.8x cuDNN + its ReLU pass, 12 shapes
# the untuned rule's tile for the 3x3, Cin = 1 conv (tensor-core path) at large M (ops.DIRECT_LARGE_M;
# docs/perf/conv.md)
DIRECT_LARGE = parse("dc256x128_v8_n128")
_SM80_ARCHS = ("sm80", "sm86", "sm87", "sm89")
_SMEM = {"sm80": 163 * 1024, "sm87": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024}

SM80_F16_CONV2D = Lane(
    name="sm80_f16_conv2d",
    family="conv2d_activation",
    template=FPROP_TEMPLATE,  # the implicit-GEMM configs'; the direct ones use conv2d_direct.cu.j2
    cuda_arch="80",
    arch_families=_SM80_ARCHS,
    native_for=_SM80_ARCHS,
    space=tuple(parse(i) for i in _DIRECT + _IMPLICIT_GEMM_2X),
    default=DIRECT_DEFAULT,
    coverage_basis=(parse("b128x128x64_w64x64x64_s3"),),
    smem_bytes=_SMEM,
)

SM90_F16_CONV2D = Lane(
    name="sm90_f16_conv2d",
    family="conv2d_activation",
    template=SM90_FPROP_TEMPLATE,  # the 3.x configs'; 2.x and direct configs use their own templates
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    # no 2.x tiles: on the H200 the best of five was 0.74-0.88x cuDNN's NHWC kernel at all 12 frontend shapes
    # (docs/perf/conv.md); they stay the sm80 lane's implicit GEMM
    space=tuple(parse(i) for i in _DIRECT + _IMPLICIT_GEMM_3X),
    default=DIRECT_DEFAULT,
    coverage_basis=(parse("t128x128x64_c1x1_ws"),),
    smem_bytes=_SMEM,
)

LANES = (SM90_F16_CONV2D, SM80_F16_CONV2D)

# The int8 implicit-GEMM conv (op `conv2d_int8_activation`, ops_int8.py): the 3.x template's int8 variants
# (`int8_fp16`, `int8_bf16`) with a K tile of 128 int8 (128 bytes, as the fp16 tiles' 64 halves). Not in `LANES`:
# nothing tunes, prebuilds or serves it through the DB yet; the op loads these kernels itself. The tiles are the
# ones benchmarks/conv2d_int8_probe measured at the Conformer's second frontend conv (docs/perf/conv.md, session 9:
# 64x256 1.68x cuDNN's fp16 conv, 128x128 2x1 1.59x, 128x128 1.57x, 64x128 1.49x; 128x256 spills).
_INT8_3X = (
    "t64x256x128_c1x1_ws",   # the default: fastest of the probe at the Conformer M shape
    "t128x128x128_c2x1_ws",
    "t128x128x128_c1x1_ws",
    "t64x128x128_c1x1_ws",
)
SM90_INT8_CONV2D = Lane(
    name="sm90_int8_conv2d",
    family="conv2d_activation",
    template=SM90_FPROP_TEMPLATE,
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=(),
    space=tuple(parse(i) for i in _INT8_3X),
    default=parse(_INT8_3X[0]),
    coverage_basis=(parse(_INT8_3X[0]),),
    smem_bytes=_SMEM,
    operand_bytes=1,
)
# The tiles `ops_int8.untuned_tile` answers (nothing tunes this lane yet): the default where Cout fills 256 columns
# as well as 128, else 128 x 128. The production prebuild compiles exactly these.
INT8_UNTUNED_TILES = (_INT8_3X[0], "t128x128x128_c1x1_ws")
