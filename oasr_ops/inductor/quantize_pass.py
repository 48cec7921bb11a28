"""`torch.compile(model, backend="oasr", options={"quantization": "int8_w8a8" | "fp8_w8a8"})`: quantize in the graph.

Runs on Dynamo's graph, before AOTAutograd: every `linear` whose weight is a module parameter (an
`nn.Parameter` graph input, fp16/bf16, [N, K] with K % 16 == 0 and N % 8 == 0 — the layers `quantize_` would
swap) is replaced by `quantize_weight` (per output channel, the same math as `quantize_`) followed by
`quantized_linear` (per-token activation quantization + `oasr::scaled_mm`, the very code `QuantLinear` runs;
both in `oasr_ops.families.scaled_mm.quantize`). fp8_w8a8 does the same with e4m3 (N % 16 == 0; `quantize_weight_fp8`,
`quantized_linear_fp8`, `oasr::scaled_mm_fp8`). The post-grad pass then bakes scaled_mm configs like gemm ones.

Weights: the parameters stay graph inputs (AOTAutograd accepts no new constants from a backend), so the weight
quantization is part of the graph. With Inductor's freezing on (`torch._inductor.config.freezing = True` before
compiling) it is constant-folded: quantized once. Without it, it runs every call — one fused memory-bound
kernel per layer reading the fp16 weight, which `quantize_(model)` + `backend="oasr"` avoids.
"""
from __future__ import annotations

from typing import Any

import torch

from ..families.scaled_mm.qconfig import Int8W8A8Config, as_quant_config
from ..families.scaled_mm.quantize import quantize_weight, quantized_linear
from ..families.scaled_mm_fp8.qconfig import Fp8W8A8Config
from ..families.scaled_mm_fp8.quantize import quantized_linear_fp8
from ..families.scaled_mm_fp8.reference import quantize_weight_fp8

_LINEARS = (torch._C._nn.linear, torch.nn.functional.linear)


def quantizing_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                      kernel: str = "auto") -> torch.Tensor:
    """`F.linear(x, w, b)` as an int8 W8A8 layer whose weight is quantized in the graph."""
    wq, sw = quantize_weight(w)
    return quantized_linear(x, wq, sw, b, w.dtype, kernel)


def quantizing_linear_fp8(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                          kernel: str = "auto") -> torch.Tensor:
    """`F.linear(x, w, b)` as an fp8 W8A8 layer whose weight is quantized in the graph (e4m3 per channel)."""
    wq, sw = quantize_weight_fp8(w)
    return quantized_linear_fp8(x, wq, sw, b, w.dtype, kernel)


def quantize_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], scheme: Any) -> int:
    """Rewrite `gm` in place; returns how many linears were quantized. `scheme`: ``"int8_w8a8"`` or an
    `Int8W8A8Config` (what `quantize_` accepts). ValueError for anything else."""
    try:
        cfg = as_quant_config(scheme)
    except ValueError as e:
        raise ValueError(f"options['quantization']: {e}") from None
    if isinstance(cfg, Fp8W8A8Config):
        replacement, n_align = quantizing_linear_fp8, 16
    elif isinstance(cfg, Int8W8A8Config):
        replacement, n_align = quantizing_linear, 8
    else:
        raise ValueError(f"options['quantization']: no in-graph rewrite for {type(cfg).__name__}; quantize the "
                         "model with quantize_() before compiling instead")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    value_of = {n: example_inputs[i] for i, n in enumerate(placeholders) if i < len(example_inputs)}
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _LINEARS:
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
            new = gm.graph.call_function(replacement, (x, w, b, cfg.kernel))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
