"""`torch.compile(model, backend="oasr", options={"quantization": "int8_w8a8" | "fp8_w8a8"})`: quantize in the graph.

Runs on Dynamo's graph, before AOTAutograd: every `linear` whose weight is a module parameter (an
`nn.Parameter` graph input, fp16/bf16, [N, K] with K % 16 == 0 and N % 8 == 0 — the layers `quantize_` would
swap) is replaced by `quantize_weight` (per output channel, the same math as `quantize_`) followed by the ops
`quantized_linear` runs (per-token activation quantization + `oasr::scaled_mm`, the very code `QuantLinear` runs;
both in `oasr_ops.families.scaled_mm.quantize`), spelt out node by node so the fusion pass (`fuse_quant`) sees
one structure for both paths. fp8_w8a8 does the same with e4m3 (N % 16 == 0;
`quantize_weight_fp8`, `quantized_linear_fp8`, `oasr::scaled_mm_fp8`; no fusion pass yet). The post-grad pass then bakes scaled_mm configs like gemm ones.

Weights: the parameters stay graph inputs (AOTAutograd accepts no new constants from a backend), so the weight
quantization is part of the graph. With Inductor's freezing on (`torch._inductor.config.freezing = True` before
compiling) it is constant-folded: quantized once. Without it, it runs every call — one fused memory-bound
kernel per layer reading the fp16 weight, which `quantize_(model)` + `backend="oasr"` avoids.
"""
from __future__ import annotations

import operator
from typing import Any

import torch

from ..families.scaled_mm.calibrate import calibrated_scale
from ..families.scaled_mm.qconfig import Int8W8A8Config, as_quant_config
from ..families.scaled_mm.quantize import quantize_weight
from ..families.scaled_mm_fp8.qconfig import Fp8W8A8Config
from ..families.scaled_mm_fp8.quantize import quantized_linear_fp8
from ..families.scaled_mm_fp8.reference import quantize_weight_fp8
from .quant_patterns import fusable_linears, restore_rows

_LINEARS = (torch._C._nn.linear, torch.nn.functional.linear)


def quantizing_linear_fp8(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                          kernel: str = "auto") -> torch.Tensor:
    """`F.linear(x, w, b)` as an fp8 W8A8 layer whose weight is quantized in the graph (e4m3 per channel)."""
    wq, sw = quantize_weight_fp8(w)
    return quantized_linear_fp8(x, wq, sw, b, w.dtype, kernel)


def _emit_quantized_linear(gm: torch.fx.GraphModule, x, w, b, kernel: str, wv: torch.Tensor,
                           scale: torch.Tensor | None) -> torch.fx.Node:
    """The nodes `quantized_linear` traces to, spelt out in the Dynamo graph so the fusion pass
    (`fuse_quant.fuse_quantization`) sees the same structure as a `quantize_`d model's: weight quantization,
    reshape + contiguous, per-token quantization (carrying a calibrated scale when there is one), scaled_mm."""
    g = gm.graph
    n, k = wv.shape
    wqs = g.call_function(quantize_weight, (w,))
    wq, sw = g.call_function(operator.getitem, (wqs, 0)), g.call_function(operator.getitem, (wqs, 1))
    x2 = g.call_method("contiguous", (g.call_method("reshape", (x, -1, k)),))
    if scale is None:
        qs = g.call_function(torch.ops.oasr.quantize_per_token.default, (x2,))
    else:
        # A constant of the graph (AOTAutograd takes no new buffers from a backend): a one-element fill, which
        # under CUDA graphs is one tiny kernel per layer; a `quantize_`d model carries it as a buffer instead.
        s = g.call_function(torch.full, ((1,), float(scale.reshape(-1)[0])),
                            {"dtype": torch.float32, "device": wv.device})
        qs = g.call_function(torch.ops.oasr.quantize_per_token_calibrated.default, (x2, s))
    q, sa = g.call_function(operator.getitem, (qs, 0)), g.call_function(operator.getitem, (qs, 1))
    out_dtype = wv.dtype
    y = g.call_function(torch.ops.oasr.scaled_mm.default, (q, wq, sa, sw, b, out_dtype, kernel))
    return g.call_function(restore_rows, (y, x))


def quantize_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], scheme: Any) -> int:
    """Rewrite `gm` in place; returns how many linears were quantized. `scheme`: ``"int8_w8a8"``, ``"fp8_w8a8"``
    or their configs (what `quantize_` accepts). ValueError for anything else. A layer calibrated with
    `oasr_ops.calibrate` carries its scale into the graph (a constant) for the fusion pass."""
    try:
        cfg = as_quant_config(scheme)
    except ValueError as e:
        raise ValueError(f"options['quantization']: {e}") from None
    if isinstance(cfg, Fp8W8A8Config):
        n_align = 16
    elif isinstance(cfg, Int8W8A8Config):
        n_align = 8
    else:
        raise ValueError(f"options['quantization']: no in-graph rewrite for {type(cfg).__name__}; quantize the "
                         "model with quantize_() before compiling instead")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    value_of = {n: example_inputs[i] for i, n in enumerate(placeholders) if i < len(example_inputs)}
    wanted = None
    if getattr(cfg, "layers", None) == "fusable":
        wanted = set(fusable_linears(gm, value_of))
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _LINEARS:
            continue
        if wanted is not None and node not in wanted:
            continue
        x, w = node.args[0], node.args[1]
        b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        wv = value_of.get(w)
        if not isinstance(wv, torch.nn.Parameter) or wv.dim() != 2 or wv.dtype not in (torch.float16,
                                                                                       torch.bfloat16):
            continue
        n, k = wv.shape
        if k % 16 or n % n_align:
            continue
        with gm.graph.inserting_before(node):
            if isinstance(cfg, Fp8W8A8Config):
                new = gm.graph.call_function(quantizing_linear_fp8, (x, w, b, cfg.kernel))
            else:
                new = _emit_quantized_linear(gm, x, w, b, cfg.kernel, wv, calibrated_scale(wv))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
