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

from ...configs import parse
from .base import Lane
from .sm90_f16_wgmma import GEMM_DEFAULT

_IDS = (
    "t64x64x64_c1x1_pp",
    "t64x128x64_c1x1_pp",
    "t128x64x64_c1x1_coop",
    "t128x128x64_c1x1_coop",
    "t128x128x64_c2x1_coop",
    "t128x256x64_c1x1_coop",
)
SPACE = tuple(parse(i) for i in _IDS)
B_MAJORS = ("k", "n")


def kernel_variant(dtype: str, b_major: str) -> str:
    """The JitSpec "dtype" of one bmm kernel: element type and B layout."""
    if b_major not in B_MAJORS:
        raise ValueError(f"B major must be one of {B_MAJORS}, got {b_major!r}")
    return f"{dtype}_b{b_major}"


def split_variant(variant: str) -> tuple[str, str]:
    """Inverse of `kernel_variant`; ValueError for anything else."""
    dtype, sep, major = variant.rpartition("_b")
    if not sep or major not in B_MAJORS or dtype not in ("fp16", "bf16"):
        raise ValueError(f"bmm kernel variant {variant!r} is not <fp16|bf16>_b<k|n>")
    return dtype, major


LANE = Lane(
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
