"""CUTLASS 3.x TMA warp-specialized fp16/bf16 batched GEMM (wgmma over CUTLASS's L mode), sm90a only.

The `bmm` family: `oasr::bmm(a [L, M, K], b [L, K, N])`, the batched products of attention written with
`torch.matmul` (`q @ k.transpose(-1, -2)`, `attn @ v`). Its configs are a subset of the gemm lane's space (same
ids, same template pieces, epilogue without bias or activation); what differs is the B operand's layout, which is
part of the kernel variant ("dtype" of this family's JitSpec): ``<dtype>_bk`` reads B K-contiguous (the transpose
of a row-major [L, N, K], like `nn.Linear`'s weight), ``<dtype>_bn`` reads B N-contiguous (row-major [L, K, N]).
Leading and batch strides are run-time arguments, so views need no copy when TMA can address them.

The subset: 64-row ping-pong tiles for short sequences and the N = 64 of `attn @ v` (head dim), 128-row
cooperative tiles for long ones; the gemm default (128x128, 2x1 cluster) is the lane default. No Stream-K: the
batch already gives enough output tiles.
"""
from __future__ import annotations

from ...codegen.render import B_MAJORS, kernel_variant, split_variant  # noqa: F401  (the variant names are codegen's)
from ...configs import Lane, parse
from ..gemm.lanes import GEMM_DEFAULT

_IDS = (
    "t64x64x64_c1x1_pp",
    "t64x128x64_c1x1_pp",
    "t128x64x64_c1x1_coop",
    "t128x128x64_c1x1_coop",
    "t128x128x64_c2x1_coop",
    "t128x256x64_c1x1_coop",
)
SPACE = tuple(parse(i) for i in _IDS)
SM90_F16_WGMMA_BMM = Lane(
    name="sm90_f16_wgmma_bmm",
    family="bmm",
    template="sm90_bmm.cu.j2",
    cuda_arch="90a",
    arch_families=("sm90",),
    native_for=("sm90",),
    space=SPACE,
    default=GEMM_DEFAULT,
    coverage_basis=(parse("t64x64x64_c1x1_pp"), parse("t128x64x64_c1x1_coop")),
    smem_bytes={"sm90": 227 * 1024},
)

LANES = (SM90_F16_WGMMA_BMM,)
