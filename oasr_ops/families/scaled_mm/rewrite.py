"""The scaled_mm family's graph matcher: a quantized model (`quantize_`, or the backend's in-graph quantization)
already calls `oasr.scaled_mm[_quant]`; record those sites (the census sees them) and, when baking, replace their
``config="auto"`` by the family's selection (static M: the int8 heuristic resolves to a tile) or the region table
(symbolic M), as for gemm. The contract is in `oasr_ops.families.graph`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..graph import RewriteContext, bake, static_int
from . import act_quant, ops, residual

FAMILY = "scaled_mm"
_CONFIG_ARG = 6  # scaled_mm(a, w, scale_a, scale_w, bias, out_dtype|out_scale, config)
_BIAS_ARG = 4
# scaled_mm_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation, config): the quantizing op's tiles
_CONFIG_ARG_ACT = 7
# scaled_mm_residual(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config): scaled_mm's tiles
_CONFIG_ARG_RES = 8


# target -> (DB op, the family's selection for it, index of the config argument)
Targets = dict[Any, tuple[str, Callable[..., Any], int]]


def rewrite_quantized_sites(ctx: RewriteContext, family: str, targets: Targets, dtype: str,
                            signature: Callable[[str, int, int], str]) -> None:
    """Bake (or, for the census, only record) every site of `targets`: the matcher shared by the quantized-GEMM
    families (int8 here, fp8 in families/scaled_mm_fp8), which differ only in their ops and dtype label."""
    for node in ctx.graph.nodes:
        if node.op != "call_function" or node.target not in targets:
            continue
        op, select, at = targets[node.target]
        a, w = node.args[0], node.args[1]
        aval = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        wval = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if aval is None or wval is None or wval.dim() != 2:
            ctx.skip(node, f"{family} operand without a known shape")
            continue
        n, k = int(wval.shape[0]), int(wval.shape[1])
        m = aval.numel() // k
        m_int = static_int(m)
        config, tier = node.args[at], ""
        if ctx.bake and config == "auto":
            if m_int is not None:  # the family's own selection: a heuristic answer becomes a concrete tile
                sel = select(n, k, m_int, ctx.arch)
                config, tier = sel.config, sel.tier
            else:
                config, tier, _sig = bake(family, op, dtype, n, k, None, ctx.arch)
            node.args = (*node.args[:at], config, *node.args[at + 1:])
        ctx.record(signature(op, n, k), family, op, dtype, n, k, m, config=config, tier=tier, node=node.name,
                   bias=node.args[_BIAS_ARG] is not None)


def rewrite(ctx: RewriteContext) -> None:
    """The `rewrite` handler: bake (or, for the census, only record) every oasr.scaled_mm[_quant] site."""
    rewrite_quantized_sites(ctx, FAMILY, {
        torch.ops.oasr.scaled_mm.default: ("scaled_mm", ops.select_config, _CONFIG_ARG),
        torch.ops.oasr.scaled_mm_quant.default: ("scaled_mm_quant", ops.select_quant_config, _CONFIG_ARG),
        torch.ops.oasr.scaled_mm_act_quant.default: ("scaled_mm_quant", act_quant.select_act_quant_config,
                                                     _CONFIG_ARG_ACT),
        torch.ops.oasr.scaled_mm_residual.default: ("scaled_mm", residual.select_residual_config, _CONFIG_ARG_RES),
    }, "int8", ops.signature)
