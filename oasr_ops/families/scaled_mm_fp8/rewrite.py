"""The fp8 family's graph matcher: a quantized model already calls `oasr.scaled_mm_fp8[_quant]`; record those
sites (the census sees them, dtype float8_e4m3fn) and, when baking, replace ``config="auto"`` by the family's
selection (static M) or the region table (symbolic M). The contract is in `oasr_ops.families.graph`."""
from __future__ import annotations

import torch

from ..graph import RewriteContext, static_int
from ..scaled_mm.rewrite import rewrite_quantized_sites
from . import act_quant, ops, residual

FAMILY = "scaled_mm_fp8"
_CONFIG_ARG = 6  # scaled_mm_fp8(a, w, scale_a, scale_w, bias, out_dtype|out_scale, config)
_OUT_DTYPE_ARG = 5
# scaled_mm_fp8_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation, config): the quantizing op's tiles
_CONFIG_ARG_ACT = 7
# scaled_mm_fp8_residual(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config): scaled_mm_fp8's tiles
_CONFIG_ARG_RES = 8


def _eager_torch_auto_sites(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The ``auto`` sites whose torch arm is eager passes around torch._scaled_mm: fp16-output `scaled_mm_fp8`,
    and `scaled_mm_fp8_quant` (its config is argument 6 too)."""
    return [n for n in graph.nodes if n.op == "call_function"
            and (n.target is torch.ops.oasr.scaled_mm_fp8_quant.default
                 or (n.target is torch.ops.oasr.scaled_mm_fp8.default and n.args[_OUT_DTYPE_ARG] == torch.float16))
            and n.args[_CONFIG_ARG] == "auto"]


def _tile_where_torch_was_baked(ctx: RewriteContext, nodes: list[torch.fx.Node]) -> None:
    """`ops.heuristic_where_torch` at bake time: a static-M site whose ``auto`` was baked to ``torch`` gets the
    tile the runtime would serve. Without this the graph names ``torch`` explicitly and the runtime, which keeps an
    explicit ``torch``, ran torch._scaled_mm with an fp32 output plus the epilogue in eager ops in compiled fp16
    models (docs/perf/e2e.md, the fp8 end-to-end runs)."""
    for node in nodes:
        if node.args[_CONFIG_ARG] != "torch":
            continue
        aval, wval = node.args[0].meta.get("val"), node.args[1].meta.get("val")
        n, k = int(wval.shape[0]), int(wval.shape[1])
        m = static_int(aval.numel() // k)
        arch = ops._current_arch(ctx.arch)
        tile = ops.heuristic_where_torch("torch", m, n, k, arch) if m is not None and arch else "torch"
        if tile == "torch":
            continue
        node.args = (*node.args[:_CONFIG_ARG], tile, *node.args[_CONFIG_ARG + 1:])
        for site in ctx.result.sites:
            if site.node == node.name:
                site.config, site.tier = tile, "heuristic"


def rewrite(ctx: RewriteContext) -> None:
    """The `rewrite` handler: bake (or, for the census, only record) every oasr.scaled_mm_fp8[_quant],
    oasr.scaled_mm_fp8_act_quant (under the quantizing op's signature) and oasr.scaled_mm_fp8_residual site (under
    the plain op's)."""
    eager_torch_auto = _eager_torch_auto_sites(ctx.graph) if ctx.bake else []
    rewrite_quantized_sites(ctx, FAMILY, {
        torch.ops.oasr.scaled_mm_fp8.default: ("scaled_mm_fp8", ops.select_config, _CONFIG_ARG),
        torch.ops.oasr.scaled_mm_fp8_quant.default: ("scaled_mm_fp8_quant", ops.select_quant_config, _CONFIG_ARG),
        torch.ops.oasr.scaled_mm_fp8_act_quant.default: ("scaled_mm_fp8_quant", act_quant.select_act_quant_config,
                                                         _CONFIG_ARG_ACT),
        torch.ops.oasr.scaled_mm_fp8_residual.default: ("scaled_mm_fp8", residual.select_residual_config,
                                                        _CONFIG_ARG_RES),
    }, "fp8", ops.signature)
    _tile_where_torch_was_baked(ctx, eager_torch_auto)
