"""The fp8 family's graph matcher: a quantized model already calls `oasr.scaled_mm_fp8[_quant]`; record those
sites (the census sees them, dtype float8_e4m3fn) and, when baking, replace ``config="auto"`` by the family's
selection (static M) or the region table (symbolic M). The contract is in `oasr_ops.families.graph`."""
from __future__ import annotations

import torch

from ..graph import RewriteContext
from ..scaled_mm.rewrite import rewrite_quantized_sites
from . import act_quant, ops

FAMILY = "scaled_mm_fp8"
_CONFIG_ARG = 6  # scaled_mm_fp8(a, w, scale_a, scale_w, bias, out_dtype|out_scale, config)
# scaled_mm_fp8_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation, config): the quantizing op's tiles
_CONFIG_ARG_ACT = 7


def rewrite(ctx: RewriteContext) -> None:
    """The `rewrite` handler: bake (or, for the census, only record) every oasr.scaled_mm_fp8[_quant] and
    oasr.scaled_mm_fp8_act_quant site (the latter under the quantizing op's signature)."""
    rewrite_quantized_sites(ctx, FAMILY, {
        torch.ops.oasr.scaled_mm_fp8.default: ("scaled_mm_fp8", ops.select_config, _CONFIG_ARG),
        torch.ops.oasr.scaled_mm_fp8_quant.default: ("scaled_mm_fp8_quant", ops.select_quant_config, _CONFIG_ARG),
        torch.ops.oasr.scaled_mm_fp8_act_quant.default: ("scaled_mm_fp8_quant", act_quant.select_act_quant_config,
                                                         _CONFIG_ARG_ACT),
    }, "fp8", ops.signature)
