"""What `oasr tune prebuild` compiles of layer_norm_quant (not a family of its own: the quantized families'
prebuild sets include it, since the fused LayerNorm is their GEMMs' producer)."""
from __future__ import annotations

import torch

from ...codegen.render_layer_norm_quant import SPACE, LnqSpec, parse_lnq
from .kernels import spec_for
from .ops import AUTO_BY_WIDTH

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def cuda_arch_for_family(arch_family: str) -> str:
    """`kernels.cuda_arch_of` for a GPU family named without a GPU (``sm90`` -> ``90a``, ``sm86`` -> ``86``)."""
    digits = arch_family.lower().replace("sm_", "").replace("sm", "").replace(".", "").rstrip("a")
    return digits + ("a" if digits == "90" else "")


def prebuild_specs(arch_family: str, scheme: str, dtypes: tuple[str, ...], all_: bool = False) -> list[LnqSpec]:
    """The kernels a `scheme` (int8 / fp8) deployment's fused LayerNorms load on `arch_family`: the configs `auto`
    serves (`ops.AUTO_BY_WIDTH`; every config with `all_`) for each of `dtypes` (``fp16`` / ``bf16``), so that
    `oasr tune prebuild` leaves a fused model nothing to compile at run time."""
    configs = SPACE if all_ else tuple(dict.fromkeys(parse_lnq(cid) for _w, cid in AUTO_BY_WIDTH))
    arch = cuda_arch_for_family(arch_family)
    return [spec_for(c, _DTYPES[d], scheme, arch) for c in configs for d in dtypes if d in _DTYPES]
