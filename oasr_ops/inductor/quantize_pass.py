"""`torch.compile(model, backend="oasr", options={"quantization": "int8_w8a8" | "fp8_w8a8"})`: quantize in the graph.

Runs on Dynamo's graph, before AOTAutograd: every `linear` whose weight is a module parameter (an
`nn.Parameter` graph input, fp16/bf16, [N, K] with K % 16 == 0 and N % 8 == 0 — the layers `quantize_` would
swap) is replaced by `quantize_weight` (per output channel, the same math as `quantize_`) followed by the ops
`quantized_linear` runs (per-token activation quantization + `oasr::scaled_mm`, the very code `QuantLinear` runs;
both in `oasr_ops.families.scaled_mm.quantize`), spelt out node by node so the fusion pass (`fuse_quant`) sees
one structure for both paths. fp8_w8a8 does the same with e4m3 (N % 16 == 0;
`quantize_weight_fp8`, `quantize_per_token_fp8[_calibrated]`, `oasr::scaled_mm_fp8`: the ops of
`quantized_linear_fp8`), the same structure with the fp8 ops. The post-grad pass then bakes scaled_mm configs like
gemm ones. int8 with ``Int8W8A8Config.convs`` (the default) also converts every conv2d `QuantConv2d` would take
(a parameter weight, groups 1, dilation 1, Cin % 16, Cout % 8) into the nodes `QuantConv2d.forward` traces to
(`_emit_quantized_conv2d`); with ``layers="fusable"`` only a calibrated one whose producer the fusion absorbs
(`fuse_conv_quant.fusable_convs`).

Weights: the parameters stay graph inputs (AOTAutograd accepts no new constants from a backend), so the weight
quantization is part of the graph. With Inductor's freezing on (`torch._inductor.config.freezing = True` before
compiling) Dynamo emits the parameters as attributes instead of inputs (`quant_patterns.graph_values` finds both)
and freezing constant-folds the quantization: quantized once (tests/test_freezing.py). Without it, it runs every
call — one fused memory-bound kernel per layer reading the fp16 weight, which `quantize_(model)` +
`backend="oasr"` avoids.
"""
from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..families.conv2d_activation.ops_int8 import quantize_conv_weight
from ..families.conv2d_activation.quantize import dynamic_input_scale
from ..families.quant_patterns import _LINEARS, fusable_linears, graph_values, positional_linears, restore_rows
from ..families.scaled_mm.calibrate import QMAX_OF, calibrated_scale
from ..families.scaled_mm.qconfig import Int8W8A8Config, as_quant_config
from ..families.scaled_mm.quantize import quantize_weight
from ..families.scaled_mm_fp8.qconfig import Fp8W8A8Config
from ..families.scaled_mm_fp8.reference import quantize_weight_fp8
from ..runtime.plans import WarnOnce
from .decompose_attention import decompose_attention
from .fuse_conv_quant import conv2d_args, fusable_convs

_WARN = WarnOnce()
_CONV_QMAX = QMAX_OF["int8_w8a8"]  # the conv is int8 only (QuantConv2d)
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class SchemeOps:
    """What one scheme's quantized linear is made of (`quantized_linear` / `quantized_linear_fp8`)."""

    n_align: int                     # the GEMM's N rule (K % 16 for both)
    qmax: float                      # activations' largest quantized value: a calibrated scale is amax / qmax
    quantize_weight: Callable        # w -> (w_q, scale_w), per output channel
    quantize: Any                    # per-token activation quantization (dynamic)
    quantize_calibrated: Any         # the same, carrying the calibrated scale for the fusion pass
    gemm: Any                        # the scaled GEMM


_SCHEMES = {
    Int8W8A8Config: SchemeOps(8, QMAX_OF["int8_w8a8"], quantize_weight, torch.ops.oasr.quantize_per_token.default,
                              torch.ops.oasr.quantize_per_token_calibrated.default, torch.ops.oasr.scaled_mm.default),
    Fp8W8A8Config: SchemeOps(16, QMAX_OF["fp8_w8a8"], quantize_weight_fp8,
                             torch.ops.oasr.quantize_per_token_fp8.default,
                             torch.ops.oasr.quantize_per_token_fp8_calibrated.default,
                             torch.ops.oasr.scaled_mm_fp8.default),
}


def _emit_quantized_linear(gm: torch.fx.GraphModule, ops: SchemeOps, x, w, b, kernel: str, wv: torch.Tensor,
                           scale: torch.Tensor | None, out_dtype: torch.dtype) -> torch.fx.Node:
    """The nodes `quantized_linear[_fp8]` traces to, spelt out in the Dynamo graph so the fusion pass
    (`fuse_quant.fuse_quantization`) sees the same structure as a `quantize_`d model's: weight quantization,
    reshape + contiguous, per-token quantization (carrying a calibrated scale when there is one), the GEMM."""
    g = gm.graph
    n, k = wv.shape
    wqs = g.call_function(ops.quantize_weight, (w,))
    wq, sw = g.call_function(operator.getitem, (wqs, 0)), g.call_function(operator.getitem, (wqs, 1))
    x2 = g.call_method("contiguous", (g.call_method("reshape", (x, -1, k)),))
    if scale is None:
        qs = g.call_function(ops.quantize, (x2,))
    else:
        # A constant of the graph (AOTAutograd takes no new buffers from a backend): a one-element fill, which
        # under CUDA graphs is one tiny kernel per layer; a `quantize_`d model carries it as a buffer instead.
        s = g.call_function(torch.full, ((1,), float(scale.reshape(-1)[0])),
                            {"dtype": torch.float32, "device": wv.device})
        qs = g.call_function(ops.quantize_calibrated, (x2, s))
    q, sa = g.call_function(operator.getitem, (qs, 0)), g.call_function(operator.getitem, (qs, 1))
    if b is not None and wv.dtype != out_dtype:  # an fp32 layer under autocast: the bias in the GEMM's dtype
        b = g.call_method("to", (b, out_dtype))
    y = g.call_function(ops.gemm, (q, wq, sa, sw, b, out_dtype, kernel))
    return g.call_function(restore_rows, (y, x))


def _emit_quantized_conv2d(gm: torch.fx.GraphModule, x, w, b, stride, padding, wv: torch.Tensor,
                           scale: torch.Tensor | None) -> torch.fx.Node:
    """The nodes `QuantConv2d.forward` traces to (families/conv2d_activation/quantize.py), spelt out so the fusion
    pass (`fuse_conv_quant`) sees one structure for both paths: the weight to KRSC and quantized per output channel
    (per call; constant-folded under freezing), the input to NHWC, per-tensor quantization with the calibrated scale
    (else a dynamic amax), `oasr.conv2d_int8_activation`, the output back to an NCHW view."""
    g = gm.graph
    wk = g.call_method("contiguous", (g.call_method("permute", (w, 0, 2, 3, 1)),))
    wqs = g.call_function(quantize_conv_weight, (wk,))
    wq, sw = g.call_function(operator.getitem, (wqs, 0)), g.call_function(operator.getitem, (wqs, 1))
    x_nhwc = g.call_method("permute", (x, 0, 2, 3, 1))
    if scale is None:
        s = g.call_function(dynamic_input_scale, (x_nhwc,))
    else:
        s = g.call_function(torch.full, ((1,), float(scale.reshape(-1)[0])),
                            {"dtype": torch.float32, "device": wv.device})
    q = g.call_method("contiguous", (g.call_function(torch.ops.oasr.quantize_per_tensor.default, (x_nhwc, s)),))
    y = g.call_function(torch.ops.oasr.conv2d_int8_activation.default,
                        (q, wq, s, sw, b, list(stride), list(padding), "none", wv.dtype, "auto"))
    return g.call_method("permute", (y, 0, 3, 1, 2))


def _quantize_convs(gm: torch.fx.GraphModule, value_of: dict, fusable_only: bool, baked: list) -> int:
    """Every qualifying conv2d of `gm` (a parameter weight `conv_qualifies` would take; with `fusable_only`, only the
    calibrated ones whose quantization the fusion pass absorbs) -> `_emit_quantized_conv2d`; returns how many."""
    wanted = set(fusable_convs(gm)) if fusable_only else None
    done = 0
    for node in list(gm.graph.nodes):
        args = conv2d_args(node)
        if args is None or (wanted is not None and node not in wanted):
            continue
        x, w, b, stride, padding = args
        wv = value_of.get(w)
        if not isinstance(wv, torch.nn.Parameter) or (b is not None and not isinstance(value_of.get(b),
                                                                                    torch.nn.Parameter)):
            continue
        cout, cin = int(wv.shape[0]), int(wv.shape[1])
        scale = calibrated_scale(wv, _CONV_QMAX)
        if cin % 16 or cout % 8 or (fusable_only and scale is None):
            continue
        with gm.graph.inserting_before(node):
            new = _emit_quantized_conv2d(gm, x, w, b, stride, padding, wv, scale)
        if scale is not None:
            baked.append(BakedScale(w, wv, _CONV_QMAX, float(scale.reshape(-1)[0])))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    return done


@dataclass(frozen=True)
class BakedScale:
    """A calibrated input scale `quantize_graph` put into the graph as a constant: the weight's node, the
    parameter it was read from, the scheme's qmax and the value."""

    weight_node: torch.fx.Node
    weight: torch.nn.Parameter
    qmax: float
    value: float


def quantize_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], scheme: Any,
                   baked: list[BakedScale] | None = None) -> int:
    """Rewrite `gm` in place; returns how many layers were quantized (linears, and int8 convs with
    ``Int8W8A8Config.convs``). `scheme`: ``"int8_w8a8"``, ``"fp8_w8a8"``
    or their configs (what `quantize_` accepts). ValueError for anything else. A layer calibrated with
    `oasr_ops.calibrate` carries its scale into the graph (a constant) for the fusion pass; each such constant is
    appended to `baked` (`calibration_guard` checks them per call)."""
    baked = [] if baked is None else baked
    try:
        cfg = as_quant_config(scheme)
    except ValueError as e:
        raise ValueError(f"options['quantization']: {e}") from None
    ops = next((o for t, o in _SCHEMES.items() if isinstance(cfg, t)), None)
    if ops is None:
        raise ValueError(f"options['quantization']: no in-graph rewrite for {type(cfg).__name__}; quantize the "
                         "model with quantize_() before compiling instead")
    # nn.MultiheadAttention's call is one node: spelt out, its in- and out-projections are Linears here too
    attention = decompose_attention(gm)
    if attention.kept:
        _WARN("attention-kept", f"options['quantization']: {len(attention.kept)} multi-head attention call(s) kept "
              f"whole, their projections not quantized: {'; '.join(attention.kept[:3])}")
    value_of = graph_values(gm, example_inputs)
    positional_linears(gm)
    wanted, uncalibrated = None, set()
    fusable_only = getattr(cfg, "layers", None) == "fusable"
    if fusable_only:
        wanted = set(fusable_linears(gm, value_of))
        # the same rule without calibration: the linears after GELU/SiLU that only a calibrated scale makes fusable
        uncalibrated = set(fusable_linears(gm, value_of, require_calibration=False)) - wanted
    done = _quantize_convs(gm, value_of, fusable_only, baked) if getattr(cfg, "convs", False) else 0
    fp32 = 0
    left = []  # qualifying linears `layers="fusable"` kept in 16 bits
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _LINEARS:
            continue
        x, w, b = node.args
        wv = value_of.get(w)
        if not isinstance(wv, torch.nn.Parameter) or wv.dim() != 2:
            continue
        # the GEMM's output dtype: a 16-bit layer's own; an fp32 layer's under autocast (its linear returned
        # fp16 / bf16: the model computes it in 16 bits anyway); no other fp32 layer is quantized
        want = node.meta.get("example_value")
        out_dtype = wv.dtype if wv.dtype in _HALF else want.dtype if (
            wv.dtype == torch.float32 and isinstance(want, torch.Tensor) and want.dtype in _HALF) else None
        if out_dtype is None:
            fp32 += wv.dtype == torch.float32
            continue
        n, k = wv.shape
        if k % 16 or n % ops.n_align:
            continue
        if wanted is not None and node not in wanted:
            left.append(node)
            continue
        scale = calibrated_scale(wv, ops.qmax)
        if scale is not None:
            baked.append(BakedScale(w, wv, ops.qmax, float(scale.reshape(-1)[0])))
        with gm.graph.inserting_before(node):
            new = _emit_quantized_linear(gm, ops, x, w, b, cfg.kernel, wv, scale, out_dtype)
            # restore_rows gives x's dtype; under autocast a bf16 layer takes an fp32 x and returns bf16: keep the
            # dtype the replaced linear returned (only then, so the fusion passes see their usual pattern)
            xv = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
            if isinstance(want, torch.Tensor) and isinstance(xv, torch.Tensor) and want.dtype != xv.dtype:
                new = gm.graph.call_method("to", (new, want.dtype))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if fp32 and not done:  # a silent no-op otherwise: the model runs unquantized
        _WARN("fp32", f"options['quantization']: {fp32} Linear layer(s) with float32 weights left unquantized (the "
              "in-graph rewrite quantizes fp16 / bf16 layers, and fp32 ones under torch.autocast: compile "
              "model.half() or .bfloat16(), call it under autocast, or quantize_() the model first, which takes "
              "float32 layers too)")
    if left:
        _warn_fusable_left(left, uncalibrated, done)
    if done or attention.decomposed:
        gm.graph.lint()
        gm.recompile()
    return done


def _warn_fusable_left(left: list[torch.fx.Node], uncalibrated: set[torch.fx.Node], done: int) -> None:
    """Say what ``layers="fusable"`` (the default) kept in 16 bits when that is a remedy away from paying: the
    linears after GELU/SiLU that calibration would make fusable, or — nothing quantized at all — every one (a
    model without the LayerNorm -> Linear structure would otherwise run in fp16 without a word)."""
    waiting = [n for n in left if n in uncalibrated]
    if waiting:
        _WARN("fusable-uncalibrated", f"options['quantization']: {len(waiting)} Linear layer(s) after GELU/SiLU "
              "(fc2) kept in 16 bits: their input quantization fuses into fc1's epilogue only with a calibrated "
              "scale. oasr_ops.calibrate(model, batches) before compiling converts them (measured end to end: "
              "1.08-1.16x of fp16 Inductor without, 1.33-1.41x with, 1.40-1.66x also frozen; docs/perf/e2e.md)")
    if not done:
        _WARN("fusable-none", f"options['quantization']: none of the model's {len(left)} qualifying Linear layer(s) "
              "takes its input from a LayerNorm (or, calibrated, from GELU/SiLU of such a layer), so layers='fusable' "
              "(the default) quantized nothing and the model runs in 16 bits. Int8W8A8Config(layers='all') "
              "(Fp8W8A8Config for fp8) quantizes them anyway; each then pays a separate activation-quantization "
              "pass, measured slower than 16 bits end to end (docs/perf/e2e.md)")


def calibration_guard(gm: torch.fx.GraphModule, baked: list[BakedScale]) -> Callable[[list], None] | None:
    """A per-call check that the weights a compiled graph receives are the ones whose calibrated scales it baked.

    Why: Dynamo reuses a compiled graph for another instance of the same module class when the two compiles'
    backends compare equal (``torch.compile`` compares their options). The parameters are graph inputs, so the
    other instance's weights flow in, but the baked scales are the first instance's: a second model calibrated on
    other data would run silently wrong (seen on the CPU: 1.5e-1 instead of 1.6e-2 vs fp32). The check is an
    identity test per baked weight input (a few microseconds per call); another parameter passes when its own
    calibrated scale equals the baked one, else the call raises naming the layer. None when nothing baked comes
    from a graph input (under freezing the weights are the graph's own attributes, not inputs)."""
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    checks = [(index[b.weight_node], weakref.ref(b.weight), b) for b in baked if b.weight_node in index]
    if not checks:
        return None
    positions = tuple(i for i, _r, _b in checks)
    expected = tuple(r for _i, r, _b in checks)

    def check(args: list) -> None:
        for i, ref in zip(positions, expected):
            if args[i] is not ref():
                break
        else:
            return
        for i, ref, b in checks:  # another instance: its own calibration must match what the graph baked
            got = args[i]
            if got is ref():
                continue
            scale = calibrated_scale(got, b.qmax, baked=False)
            value = None if scale is None else float(scale.reshape(-1)[0])
            if value != b.value:
                raise RuntimeError(
                    f"options['quantization']: this compiled graph baked the calibrated input scale {b.value:.6g} "
                    f"of the layer whose weight is {b.weight_node.target or b.weight_node.name}, but it is being "
                    f"run with another module's weight, whose scale is "
                    f"{'not calibrated' if value is None else f'{value:.6g}'}: torch.compile reused a graph "
                    "compiled for another instance of the same class (equal backend options). Compile each "
                    "differently calibrated model after torch.compiler.reset(), or give each its own backend "
                    "(functools.partial(oasr_ops.inductor.backend.oasr_backend, options=...)).")

    return check
