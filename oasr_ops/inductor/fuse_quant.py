"""The backend's quantization fusion pass: move activation quantization into its producer, on Dynamo's graph.

Both int8 paths reach the backend with the same node structure (``quantize_`` models through `QuantLinear`, the
``options={"quantization": ...}`` path through `quantize_pass`): ``reshape -> contiguous ->
oasr.quantize_per_token[_calibrated] -> getitem -> oasr.scaled_mm``; both fp8 paths the same with
``oasr.quantize_per_token_fp8[_calibrated]`` and ``oasr.scaled_mm_fp8``. Two rewrites:

1. LayerNorm -> quantize: ``layer_norm(x)`` whose output (through views) feeds per-token quantizations becomes one
   ``oasr.layer_norm_quant(x)``: one read of x writes the int8 (or e4m3) row and its scale; every quantizing
   consumer of that LayerNorm (Q, K and V of an attention block) reads them. The normalized fp16 row is written
   too only when a consumer other than a quantization reads it (``normalized=True``).
2. GEMM -> activation -> quantize: ``scaled_mm(...) -> gelu|silu -> quantize_per_token_calibrated(., s)`` (fc1 ->
   act -> fc2 with fc2 calibrated) becomes ``oasr.scaled_mm_act_quant(..., out_scale=s, act)``: the int8 hidden
   comes out of fc1's epilogue and fc2 reads it with ``scale_a = s``; the fp16 hidden is never written. fp8:
   ``scaled_mm_fp8 -> gelu|silu -> quantize_per_token_fp8_calibrated(., s)`` becomes
   ``oasr.scaled_mm_fp8_act_quant`` (e4m3 hidden, fc2's ``scaled_mm_fp8`` reads it with ``scale_a = s``).

3. Conv -> activation -> quantize (int8 `QuantConv2d`): the frontend's first conv writes the second's int8 input
   (``oasr.conv2d_activation_quant``), and the int8 conv takes its ReLU (`fuse_conv_quant`).

fp8 graphs get both rewrites too: the LayerNorm becomes ``oasr.layer_norm_quant(..., scheme="fp8")`` (e4m3 rows,
scale amax / 448, what ``quantize_per_token_fp8`` computes) when every quantization it feeds is an fp8 one; a
LayerNorm feeding both schemes stays as it is (reported in ``unfused``).

Why on Dynamo's graph (before AOTAutograd) rather than as a post-grad pattern: there LayerNorm, GELU/SiLU, the
reshapes and our ops are single nodes; post-grad, LayerNorm and the composite quantization are decomposed into
a dozen ATen ops whose form changes with dtype and torch version. The result is part of the graph that
AOTAutograd traces, so Inductor's FX-graph cache key covers it (a cache hit cannot skip it); the pass's source is
hashed into `OasrRewritePass.uuid` as well (`rewrite._family_sources`).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..families.quant_patterns import (_QUANT, _QUANT_CAL, _QUANT_FP8, _QUANT_FP8_CAL, _SCALED_MM,  # noqa: F401
                                       _SCALED_MM_FP8, _activation, _is_view, _layer_norm_args, act_pairs,
                                       eliminate_dead_code, fusable_linears, graph_values, restore_rows,
                                       through_views, trace_dynamo_graphs)
from ..families.self_attention import convertible
from .decompose_attention import decompose_attention
from .fuse_conv_quant import fusable_convs, fuse_conv_quantization
from .pass_log import PassLog

# calibrated quantization -> (the GEMMs whose activated output it may absorb, the fused op): int8, fp8
_ACT_QUANT_RULES = (
    (_QUANT_CAL, _SCALED_MM, torch.ops.oasr.scaled_mm_act_quant.default),
    (_QUANT_FP8_CAL, _SCALED_MM_FP8, torch.ops.oasr.scaled_mm_fp8_act_quant.default),
)
_FP8_QUANTS = _QUANT_FP8 | _QUANT_FP8_CAL
_ALL_QUANTS = _QUANT | _QUANT_CAL | _FP8_QUANTS


@dataclass
class FuseReport:
    layer_norm_quant: int = 0   # LayerNorms served by oasr.layer_norm_quant
    quant_consumers: int = 0    # quantizations those absorbed
    act_quant: int = 0          # GEMM -> activation -> quantization chains served by oasr.scaled_mm[_fp8]_act_quant
    conv_quant: int = 0         # conv + activation -> per-tensor quantization served by oasr.conv2d_activation_quant
    conv_act: int = 0           # activations folded into oasr.conv2d_int8_activation
    unfused: list[str] = field(default_factory=list)  # quantizations left as they were, and why


def _getitems(q: torch.fx.Node) -> dict[int, torch.fx.Node]:
    return {u.args[1]: u for u in q.users if u.op == "call_function" and u.target is operator.getitem}


def _shape_only_use(user: torch.fx.Node, of: torch.fx.Node) -> bool:
    """`user` reads only the shape / dtype of `of` (once traced, `of`'s data has no reader there)."""
    if user.op == "call_function" and user.target is restore_rows:
        return user.args[0] is not of
    return user.op == "call_method" and user.target in ("size", "dim")


def _chain_users_only_lead_to(start: torch.fx.Node, allowed: set) -> bool:
    """Every use of `start`'s data, followed through views, ends in `allowed` nodes."""
    for u in start.users:
        if u in allowed or _shape_only_use(u, start):
            continue
        if _is_view(u) and _chain_users_only_lead_to(u, allowed):
            continue
        return False
    return True


def _row_width(n: Any) -> int | None:
    """The last dim of the rows a quantization reads, from the traced value or the view chain's explicit sizes;
    None where neither says (the quantize pass's own reshapes to [-1, K] keep the width they were given)."""
    while isinstance(n, torch.fx.Node):
        v = n.meta.get("example_value")
        if isinstance(v, torch.Tensor):
            return int(v.shape[-1])
        if n.op == "call_method" and n.target in ("reshape", "view") and len(n.args) > 1:
            last = n.args[-1] if len(n.args) > 2 or not isinstance(n.args[1], (tuple, list)) else n.args[1][-1]
            if isinstance(last, int) and last != -1:
                return last
        if not (n.op == "call_method" and n.target == "contiguous") and not (
                n.op == "call_function" and n.target is restore_rows):
            return None
        n = n.args[0]
    return None


def _fuse_layer_norms(gm: torch.fx.GraphModule, quants: list[torch.fx.Node], rep: FuseReport) -> None:
    g = gm.graph
    by_ln: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for q in quants:
        src = through_views(q.args[0])
        if _layer_norm_args(src) is not None:
            by_ln.setdefault(src, []).append(q)
    for ln, qs in by_ln.items():
        schemes = {"fp8" if q.target in _FP8_QUANTS else "int8" for q in qs}
        if len(schemes) > 1:
            rep.unfused.append(f"{ln.name}: LayerNorm feeding both int8 and fp8 quantizations")
            continue
        scheme = schemes.pop()
        x, w, b, eps = _layer_norm_args(ln)
        k = ln.meta.get("example_value")
        width = int(k.shape[-1]) if isinstance(k, torch.Tensor) else None
        if width is None:
            rep.unfused.append(f"{ln.name}: LayerNorm without a known width")
            continue
        # a reshape between the LayerNorm and a quantization that changes the row width (e.g. [B, T, C] ->
        # [B, T/2, 2C]) regroups the rows: the LayerNorm's per-row scales would not be the quantization's
        if any(_row_width(q.args[0]) not in (None, width) for q in qs):
            rep.unfused.append(f"{ln.name}: a quantization of its output reads rows of another width than its "
                               f"{width}")
            continue
        others = not _chain_users_only_lead_to(ln, set(qs))
        with g.inserting_before(ln):
            xc = g.call_method("contiguous", (x,))
            lnq = g.call_function(torch.ops.oasr.layer_norm_quant.default, (xc, w, b, eps, others, scheme, "auto"))
            q_rows = g.call_method("reshape", (g.call_function(operator.getitem, (lnq, 0)), -1, width))
            scale = g.call_function(operator.getitem, (lnq, 1))
            y = g.call_function(operator.getitem, (lnq, 2)) if others else None
        for q in qs:
            items = _getitems(q)
            if 0 in items:
                items[0].replace_all_uses_with(q_rows)
            if 1 in items:
                items[1].replace_all_uses_with(scale)
            rep.quant_consumers += 1
        if y is not None:
            y.meta.update(ln.meta)
            ln.replace_all_uses_with(y)
        rep.layer_norm_quant += 1


def _fuse_act_quant(gm: torch.fx.GraphModule, quants: list[torch.fx.Node], rep: FuseReport) -> None:
    g = gm.graph
    for q in quants:
        rule = next((r for r in _ACT_QUANT_RULES if q.target in r[0]), None)
        if rule is None:
            continue
        _cal, gemms, fused_op = rule
        act_node = through_views(q.args[0])
        act = _activation(act_node)
        gemm = through_views(act_node.args[0]) if act else None
        if not (isinstance(gemm, torch.fx.Node) and gemm.op == "call_function" and gemm.target in gemms):
            continue
        if not (_chain_users_only_lead_to(act_node, {q}) and _chain_users_only_lead_to(gemm, {act_node})):
            rep.unfused.append(f"{q.name}: the {act} output or its GEMM's output has another consumer")
            continue
        a, w, sa, sw, bias = gemm.args[:5]
        config = gemm.args[6] if len(gemm.args) > 6 else "auto"
        out_scale = q.args[1]
        with g.inserting_before(q):
            # the int8 act-quant kernels read the GEMM's 16-bit bias as it is; the fp8 ones an fp32 bias (a cast
            # kernel per call unless the graph is frozen)
            if bias is not None and fused_op is not torch.ops.oasr.scaled_mm_act_quant.default:
                bias = g.call_method("float", (bias,))
            h = g.call_function(fused_op, (a, w, sa, sw, bias, out_scale, act, config))
            h_rows = g.call_method("reshape", (h, -1, g.call_method("size", (h, -1))))
        items = _getitems(q)
        if 0 in items:
            items[0].replace_all_uses_with(h_rows)
        if 1 in items:
            items[1].replace_all_uses_with(out_scale)
        rep.act_quant += 1


# every report of this process, oldest first, bounded: `FUSE_LOG.mark()` before a compile and
# `FUSE_LOG.since(mark)` after it read that compile's reports (pass_log.py says why not a length)
FUSE_LOG: PassLog[FuseReport] = PassLog()


def fuse_log() -> list[FuseReport]:
    """The reports kept (the last 64), oldest first."""
    return FUSE_LOG.entries()


def fuse_quantization(gm: torch.fx.GraphModule, layer_norms: bool = True) -> FuseReport:
    """Apply both rewrites to `gm` in place (module docstring); returns what was fused. `layer_norms=False`: only
    the GEMM -> activation -> quantize rewrite; a LayerNorm's quantization stays for Inductor, which fuses it into
    one kernel with the LayerNorm and the residual add before it (`oasr.layer_norm_quant`, an opaque op, ends
    that fusion: the add becomes a kernel of its own; measured in docs/perf/e2e.md). int8 and fp8 alike."""
    rep = FuseReport()
    FUSE_LOG.append(rep)
    rep.conv_quant, rep.conv_act = fuse_conv_quantization(gm)  # int8 convs (fuse_conv_quant.py)
    quants = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _ALL_QUANTS]
    if not quants and not (rep.conv_quant or rep.conv_act):
        return rep  # nothing rewritten: no recompile
    _fuse_act_quant(gm, quants, rep)
    if layer_norms:
        _fuse_layer_norms(gm, quants, rep)
    eliminate_dead_code(gm.graph)
    left = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _ALL_QUANTS]
    for n in left:
        producer = through_views(n.args[0])
        if _layer_norm_args(producer) is not None and not layer_norms:
            continue  # left to Inductor on purpose
        rep.unfused.append(f"{n.name}: producer {getattr(producer, 'name', '?')} is not a "
                           "LayerNorm, nor a GEMM + GELU/SiLU with a calibrated scale")
    gm.graph.lint()
    gm.recompile()
    return rep


@dataclass(frozen=True)
class FusableLayers:
    """`fusable_filter`'s answer, a `quantize_` filter_fn (``flt(module, fqn) -> bool``): `layers`, the fqns of
    the layers whose input quantization the fusion pass absorbs, and `requires`, fqn -> the layer it is fusable
    only with (an fc2 -> its fc1: fc2's input is quantized in fc1's epilogue, so an fc2 quantized without its fc1
    pays a separate quantization pass). `oasr_ops.error_budget_filter` reads `requires` to keep such pairs
    together."""

    layers: frozenset[str]
    requires: dict[str, str] = field(default_factory=dict)

    def __call__(self, module: torch.nn.Module, fqn: str) -> bool:
        return fqn in self.layers


def fusable_filter(model: torch.nn.Module, *args, **kwargs) -> FusableLayers:
    """A `quantize_` filter_fn selecting the layers of `model` whose quantization the fusion pass absorbs
    (`fusable_linears`, without the calibration requirement: calibrate after `quantize_`; and the convs fed by a
    direct-kernel conv + activation, `fuse_conv_quant.fusable_convs`), with the fc2 -> fc1 dependencies
    (`FusableLayers`). Traces `model(*args, **kwargs)` once with Dynamo (no compilation)."""
    names = {id(m.weight): fqn for fqn, m in model.named_modules()
             if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))}
    # a stock nn.MultiheadAttention's packed in-projection: the Linear quantize_ makes of it (LinearMultiheadAttention)
    names.update({id(m.in_proj_weight): f"{fqn}.in_proj" if fqn else "in_proj" for fqn, m in model.named_modules()
                  if convertible(m)})
    found: set[str] = set()
    requires: dict[str, str] = {}

    def capture(gm, example_inputs):
        decompose_attention(gm)
        value_of = graph_values(gm, example_inputs)
        fqn_of = {}
        for node in fusable_linears(gm, value_of, require_calibration=False) + fusable_convs(gm):
            fqn = names.get(id(value_of.get(node.args[1])))
            if fqn is not None:
                found.add(fqn)
                fqn_of[node] = fqn
        for fc2, fc1 in act_pairs(list(fqn_of)):  # an fc2: its input is act(fc1(...)), fc1 itself fusable
            requires[fqn_of[fc2]] = fqn_of[fc1]

    trace_dynamo_graphs(model, capture, *args, **kwargs)
    return FusableLayers(frozenset(found), requires)
