"""Graph patterns shared by the int8 / fp8 passes (`inductor/quantize_pass`, `inductor/fuse_quant`) and the census
(`tune/census_fused`): what a quantized linear's input quantization can be fused into, seen on Dynamo's graph
(views looked through, LayerNorm and GELU/SiLU nodes, `restore_rows`), and which linears int8 pays for. Below the
graph pass (families layer) so that the census, which sits under it, reads the same patterns."""
from __future__ import annotations

import operator

import torch


def graph_values(gm: torch.fx.GraphModule, example_inputs: list) -> dict:
    """The value behind each input node of a Dynamo graph: a placeholder's example input, and a ``get_attr``'s module
    attribute — under Inductor's freezing (``torch._inductor.config.freezing`` and no grad) Dynamo emits the
    parameters as attributes of the graph module, not as inputs, and a pass that looked only at placeholders would
    find no weight to quantize."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = {n: example_inputs[i] for i, n in enumerate(placeholders) if i < len(example_inputs)}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            try:
                values[n] = operator.attrgetter(n.target)(gm)  # a dotted target: submodule path
            except AttributeError:
                pass
    return values


def trace_dynamo_graphs(model: torch.nn.Module, on_graph, *args, **kwargs) -> None:
    """Run ``model(*args, **kwargs)`` once under no_grad through Dynamo without compiling anything, calling
    ``on_graph(gm, example_inputs)`` on each graph it captures — the analyses that must see the graph the backend's
    passes will see (`fusable_filter`, the census's fc1 -> fc2 pairs). Traced off PyTorch's fused transformer fast
    path, as `quantize_` keeps a quantized stock layer off it."""
    def capture(gm, example_inputs):
        on_graph(gm, example_inputs)
        return gm.forward

    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.compile(model, backend=capture)(*args, **kwargs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)


def restore_rows(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The quantized linear's [M, N] output back to x's leading dims (and dtype: an fp32 layer computes in fp16)."""
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    return y if y.dtype == x.dtype else y.to(x.dtype)


def mutates_in_place(n: torch.fx.Node) -> bool:
    """`n` modifies a tensor in place (``x.mul_(2)``, ``x += y``): FX's purity check sees only call_function side
    effects, so a method call like ``mul_`` whose result nobody reads looks dead."""
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "") if n.op == "call_function" else ""
    return isinstance(name, str) and name.endswith("_") and not name.startswith("_") or (
        n.op == "call_function" and n.target in (operator.iadd, operator.isub, operator.imul, operator.itruediv))


def eliminate_dead_code(graph: torch.fx.Graph) -> None:
    """`graph.eliminate_dead_code` keeping in-place updates (`mutates_in_place`): the passes drop the nodes they
    replaced, never a user's ``k.mul_(2)``. Written out (users before producers, as FX does) rather than through
    its ``is_impure_node`` hook, which not every supported torch has."""
    for n in reversed(list(graph.nodes)):
        if not n.users and not n.is_impure() and not mutates_in_place(n):
            graph.erase_node(n)


_QUANT = {torch.ops.oasr.quantize_per_token, torch.ops.oasr.quantize_per_token.default}
_QUANT_CAL = {torch.ops.oasr.quantize_per_token_calibrated, torch.ops.oasr.quantize_per_token_calibrated.default}
_SCALED_MM = {torch.ops.oasr.scaled_mm, torch.ops.oasr.scaled_mm.default}
# the fp8 e4m3 counterparts (families/scaled_mm_fp8)
_QUANT_FP8 = {torch.ops.oasr.quantize_per_token_fp8, torch.ops.oasr.quantize_per_token_fp8.default}
_QUANT_FP8_CAL = {torch.ops.oasr.quantize_per_token_fp8_calibrated,
                  torch.ops.oasr.quantize_per_token_fp8_calibrated.default}
_SCALED_MM_FP8 = {torch.ops.oasr.scaled_mm_fp8, torch.ops.oasr.scaled_mm_fp8.default}
_LAYER_NORMS = {torch.nn.functional.layer_norm, torch.layer_norm}
_GELU = {torch._C._nn.gelu, torch.nn.functional.gelu}
_SILU = {torch.nn.functional.silu, torch.ops.aten.silu, torch.ops.aten.silu.default}
_VIEW_METHODS = {"reshape", "view", "contiguous"}


_DROPOUTS = {torch.nn.functional.dropout, torch.dropout}


def _is_view(n: torch.fx.Node) -> bool:
    if n.op == "call_method" and n.target in _VIEW_METHODS:
        return True
    if n.op == "call_function" and n.target in _DROPOUTS:  # an identity in eval: `F.dropout(x, p, False)`
        return _arg(n, 2, "training" if n.target is torch.nn.functional.dropout else "train", True) is False
    return n.op == "call_function" and n.target in (torch.reshape, restore_rows)


def through_views(n):
    """The producer of `n` looking through reshapes / views / contiguous (and `restore_rows`), and eval-mode dropout
    (`nn.TransformerEncoderLayer` puts one between its activation and linear2)."""
    while isinstance(n, torch.fx.Node) and _is_view(n):
        n = n.args[0]
    return n


def _arg(node: torch.fx.Node, i: int, name: str, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _activation(n) -> str | None:
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return None
    if n.target in _GELU:
        return "gelu" if _arg(n, 1, "approximate", "none") == "none" else None
    if n.target in _SILU:
        return "silu"
    return None


def act_pairs(nodes: list[torch.fx.Node]) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(fc2, fc1) for each node of `nodes` whose input is GELU/SiLU of another node of `nodes`' output (views looked
    through): the pairs whose fc1 the fusion pass serves with an act-quant GEMM once fc2's scale is calibrated."""
    members = set(nodes)
    out = []
    for fc2 in nodes:
        src = through_views(fc2.args[0])
        fc1 = through_views(src.args[0]) if _activation(src) else None
        if fc1 in members:
            out.append((fc2, fc1))
    return out


def _layer_norm_args(n) -> tuple | None:
    """(x, weight, bias, eps) of a LayerNorm over the last dim, else None."""
    if not isinstance(n, torch.fx.Node) or n.op != "call_function" or n.target not in _LAYER_NORMS:
        return None
    shape = _arg(n, 1, "normalized_shape")
    if not isinstance(shape, (tuple, list)) or len(shape) != 1:
        return None
    eps = _arg(n, 4, "eps", 1e-5)
    if not isinstance(eps, (int, float)):  # torch.compile(dynamic=True) makes it a graph input (`.item()` node)
        return None
    return n.args[0], _arg(n, 2, "weight"), _arg(n, 3, "bias"), float(eps)


_LINEARS = (torch._C._nn.linear, torch.nn.functional.linear)


def positional_linears(gm: torch.fx.GraphModule) -> None:
    """Rewrite every `linear` call of a Dynamo graph to the positional form ``linear(input, weight, bias)`` (bias
    None when absent): Dynamo keeps the keywords of ``F.linear(x, weight=w, bias=b)``, and the quantization passes
    read the operands by position (they raised IndexError on such a call)."""
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _LINEARS and (n.kwargs or len(n.args) != 3):
            n.args = (_arg(n, 0, "input"), _arg(n, 1, "weight"), _arg(n, 2, "bias"))
            n.kwargs = {}
            changed = True
    if changed:
        gm.recompile()


def fusable_linears(gm: torch.fx.GraphModule, value_of: dict | None = None,
                    require_calibration: bool = True) -> list[torch.fx.Node]:
    """The `linear` nodes of a Dynamo graph whose input quantization the fusion pass absorbs: input from a
    LayerNorm (-> `layer_norm_quant`), or from GELU/SiLU of a linear that is itself in the list (-> fc1's
    `scaled_mm_act_quant`; with `require_calibration`, only when the layer has a calibrated scale — `value_of`
    maps the weight nodes to the parameters, `graph_values`). The others — attention
    out-projections, the conv module's pointwise2 — would pay a separate quantization pass per call, which costs
    more than their int8 GEMM saves (docs/perf/e2e.md: 6.0 ms with every layer int8 vs 4.68 ms with only the
    layers after a LayerNorm, fp16 4.34 ms, Conformer M on the H200)."""
    from .scaled_mm.calibrate import calibrated_scale

    value_of = value_of or {}
    positional_linears(gm)
    chosen: list[torch.fx.Node] = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _LINEARS:
            continue
        src = through_views(n.args[0])
        if _layer_norm_args(src) is not None:
            chosen.append(n)
        elif _activation(src) and through_views(src.args[0]) in chosen:
            w = value_of.get(n.args[1])
            if not require_calibration or (w is not None and calibrated_scale(w, baked=False) is not None):
                chosen.append(n)
    return chosen


