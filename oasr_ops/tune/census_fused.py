"""The census of a calibrated, fused quantized deployment (`oasr tune census --quantization S --calibrated`).

Compiled with ``backend="oasr"`` (``fuse_quantization`` on, the default), a calibrated int8 / fp8 model does not
run its FFN's fc1 as the plain quantized GEMM: the fusion pass (`inductor/fuse_quant.py`) serves fc1 -> GELU/SiLU
-> fc2's quantization as one GEMM whose epilogue writes fc2's quantized input (`oasr.scaled_mm_act_quant`,
`oasr.scaled_mm_fp8_act_quant`), and that op reads its tile from the DB under another op (``scaled_mm_quant``,
``scaled_mm_fp8_quant``). The census traces the model with `make_fx` before any fusion pass, so it sees the plain
op; without this step a build tunes fc1 under an op the deployment never looks up, and the fused fc1 — the FFN's
largest GEMM — runs the family's untuned answer.

How (decision: reuse the fusion's own patterns, `families/quant_patterns.py`, rather than match the fused pattern a
second time on the decomposed ATen graph): one Dynamo trace of the full-precision model (on the ``meta`` device: no
compute) names its (fc2 -> fc1) pairs — every Linear whose input is GELU/SiLU of another Linear's output, as the
fusion pass fuses any quantized GEMM -> GELU/SiLU -> calibrated quantization, whatever feeds the GEMM; in each
census trace, a quantized GEMM site whose weight is a parameter of such an fc1 (the weight placeholder's name,
through view-like nodes) is recorded under the op its family's ``act_quant_op`` handler names. Only pairs whose
fc2 is quantized as well count (the epilogue writes fc2's input). Not seen: the pass leaves a pair unfused when
fc1's output or the activation has another consumer; the census still records that fc1 as fused.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

# the frames of the one meta-device trace that finds the pairs, when the model has no fixed window (no compute)
PAIR_TRACE_FRAMES = 400


def act_quant_pairs(model: Any, make_input: Callable[[int, int], tuple[tuple[int, ...], Any, Any]],
                    fixed_window: int | None = None) -> dict[str, str]:
    """{fc2 fqn: fc1 fqn} of `model` (full precision, before `quantize_`): every Linear -> GELU/SiLU -> Linear, whose
    fc1 the fusion pass serves with the act-quant GEMM once both are quantized and fc2 is calibrated. One Dynamo
    trace (no compilation) of a ``meta`` copy of the model: the original is not touched and nothing is computed."""
    import torch

    from ..families.quant_patterns import _LINEARS, act_pairs, graph_values, positional_linears, trace_dynamo_graphs

    shape, dtype, _device = make_input(1, int(fixed_window or PAIR_TRACE_FRAMES))
    on_meta = copy.deepcopy(model).to("meta")
    fqn_of_weight = {id(m.weight): fqn for fqn, m in on_meta.named_modules() if isinstance(m, torch.nn.Linear)}
    pairs: dict[str, str] = {}

    def capture(gm, example_inputs):
        value_of = graph_values(gm, example_inputs)
        positional_linears(gm)
        linears = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _LINEARS]
        for fc2, fc1 in act_pairs(linears):
            names = [fqn_of_weight.get(id(value_of.get(n.args[1]))) for n in (fc2, fc1)]
            if None not in names:
                pairs[names[0]] = names[1]

    trace_dynamo_graphs(on_meta, capture, torch.empty(shape, dtype=dtype, device="meta"))
    return pairs


def _weight_source(node: Any) -> Any:
    """The placeholder a GEMM's weight argument comes from, through single-input view-like nodes, or None."""
    import torch

    w = node.args[1] if len(node.args) > 1 else None
    for _ in range(8):  # a weight reaches the GEMM directly or through a reshape / transpose or two
        if not isinstance(w, torch.fx.Node):
            return None
        if w.op == "placeholder":
            return w
        if w.op != "call_function" or not w.args or len(w.all_input_nodes) != 1:
            return None
        w = w.args[0]
    return None


def fused_site_ops(graph: Any, sites: list[Any], param_names: list[str],
                   pairs: Mapping[str, str]) -> dict[str, str]:
    """{site node name: the DB op it runs under in the fused deployment} for the sites of `graph` (a census trace
    whose first placeholders are the parameters and buffers `param_names`, in order) that are the fc1 of a pair
    in `pairs` whose fc2 is a quantized site too. Sites of a family without an ``act_quant_op`` handler, or whose
    op it does not map, are left out."""
    from ..runtime import registry

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    fqn_of = {ph: name for ph, name in zip(placeholders, param_names)}
    nodes = {n.name: n for n in graph.nodes}
    quantized: dict[str, tuple[str, str]] = {}  # node name -> (the module owning its weight, its fused op)
    for site in sites:
        spec = registry.families().get(site.family)
        to_fused = spec.handler("act_quant_op") if spec is not None else None
        if to_fused is None:  # not a quantized GEMM family
            continue
        node = nodes.get(site.node)
        src = _weight_source(node) if node is not None else None
        if src in fqn_of:
            quantized[site.node] = (fqn_of[src].rpartition(".")[0], to_fused(site.op))
    modules = {module for module, _ in quantized.values()}
    fc1s = {fc1 for fc2, fc1 in pairs.items() if fc2 in modules}
    return {name: fused for name, (module, fused) in quantized.items() if module in fc1s and fused is not None}
