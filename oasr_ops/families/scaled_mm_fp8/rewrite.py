"""The fp8 family's graph matcher: a quantized model already calls `oasr.scaled_mm_fp8[_quant]`; record those
sites (the census sees them, dtype float8_e4m3fn) and, when baking, replace ``config="auto"`` by the family's
selection (static M) or the region table (symbolic M). The contract is in `oasr_ops.families.graph`."""
from __future__ import annotations

import torch

from ..graph import RewriteContext, bake, static_int
from . import ops

FAMILY = "scaled_mm_fp8"
_CONFIG_ARG = 6  # scaled_mm_fp8(a, w, scale_a, scale_w, bias, out_dtype|out_scale, config)
_BIAS_ARG = 4


def rewrite(ctx: RewriteContext) -> None:
    """The `rewrite` handler: bake (or, for the census, only record) every oasr.scaled_mm_fp8[_quant] site."""
    targets = {torch.ops.oasr.scaled_mm_fp8.default: ("scaled_mm_fp8", ops.select_config),
               torch.ops.oasr.scaled_mm_fp8_quant.default: ("scaled_mm_fp8_quant", ops.select_quant_config)}
    for node in ctx.graph.nodes:
        if node.op != "call_function" or node.target not in targets:
            continue
        op, select = targets[node.target]
        a, w = node.args[0], node.args[1]
        aval = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        wval = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if aval is None or wval is None or wval.dim() != 2:
            ctx.skip(node, "scaled_mm_fp8 operand without a known shape")
            continue
        n, k = int(wval.shape[0]), int(wval.shape[1])
        m = aval.numel() // k
        m_int = static_int(m)
        config, tier = node.args[_CONFIG_ARG], ""
        if ctx.bake and config == "auto":
            if m_int is not None:
                sel = select(n, k, m_int, ctx.arch)
                config, tier = sel.config, sel.tier
            else:
                config, tier, _sig = bake(FAMILY, op, "fp8", n, k, None, ctx.arch)
            node.args = (*node.args[:_CONFIG_ARG], config)
        ctx.record(ops.signature(op, n, k), FAMILY, op, "fp8", n, k, m, config=config, tier=tier, node=node.name,
                   bias=node.args[_BIAS_ARG] is not None)
