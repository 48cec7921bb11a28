"""`backend="oasr"` under Inductor's freezing (``torch._inductor.config.freezing = True``, the common inference
setting): the same oasr sites as without it, and no per-call work left on the weights.

Freezing's constant folding runs before the post-grad passes and turns every Linear's ``permute(W, [1, 0])`` into
a constant; the gemm matcher (and the frontend's copy-free flatten) used to see no permute there and left every
fp16 Linear on aten (found on the H200 in session 22: the frozen int8 Conformer lost its 17 `oasr::gemm` sites
and launched 41 more kernels per call). The weight transforms the rewrite itself inserts (KRSC conv weights, the
frontend's column-permuted Linear weight, the depthwise conv's fp32 BatchNorm scale) are folded once, after it.
Under freezing Dynamo also emits the parameters as attributes, not graph inputs: the in-graph quantization
(`options={"quantization": ...}`) and `fusable_filter`, which looked for weights among the inputs only, quantized
nothing then. On the CPU: the real compile, passes and CPU reference ops (which check the weight layout as CUDA
does).
"""
from __future__ import annotations

import collections
import copy
import dataclasses

import pytest
import torch

import oasr_ops
from oasr_ops.families.scaled_mm.qconfig import as_quant_config
from examples.conformer import build_model, example_inputs
from _fx_capture import Capture

pytestmark = [pytest.mark.usefixtures("fresh_inductor"), pytest.mark.slow]  # two compiles per case: ~15 s each

INT8_OPTIONS = {"fuse_quantization": "act", "fuse_residual": True}


def _compiled(model, x, freezing: bool, options: dict):
    """(output, {oasr op: count}, [nodes computed from constants alone]) of `model` compiled under `freezing`
    (without it the weights are graph inputs, not constants: that list is empty by construction)."""
    import torch._inductor.config as inductor_config

    from oasr_ops.inductor.backend import oasr_backend

    torch.compiler.reset()
    cap = Capture()
    with torch.no_grad(), inductor_config.patch(freezing=freezing):
        out = torch.compile(copy.deepcopy(model), backend=oasr_backend,
                            options={**options, "post_grad_custom_pre_pass": cap})(*x)
    assert inductor_config.freezing is False
    (graph,) = cap.graphs
    ops = collections.Counter(str(n.target) for n in graph.nodes
                              if n.op == "call_function" and str(n.target).startswith("oasr."))
    const = {n for n in graph.nodes if n.op == "get_attr"}
    assert bool(const) == freezing  # the weights are constants exactly when frozen
    per_call = []
    for n in graph.nodes:
        if n.op == "call_function" and n.all_input_nodes and all(a in const for a in n.all_input_nodes):
            const.add(n)
            per_call.append(f"{n.target}{tuple(n.args[1:])}")
    return out, ops, per_call


@pytest.mark.parametrize("quantized", [False, True], ids=["fp16", "int8"])
def test_frozen_graph_keeps_every_site_and_folds_the_weight_transforms(quantized):
    model = build_model("S", num_layers=1, dtype="fp16")
    x = example_inputs(2, 200, dtype="fp16", seed=5)
    options = {}
    if quantized:
        model = oasr_ops.quantize_(model, "int8_w8a8", filter_fn=oasr_ops.fusable_filter(copy.deepcopy(model), *x))
        oasr_ops.calibrate(model, [x])
        options = INT8_OPTIONS
    out, ops, per_call = _compiled(model, x, False, options)
    frozen_out, frozen_ops, frozen_per_call = _compiled(model, x, True, options)

    assert ops["oasr.gemm.default"] >= 3, ops  # fp16: every Linear; int8: the ones quantize_ left in fp16
    assert frozen_ops == ops, (frozen_ops, ops)
    assert frozen_per_call == [], frozen_per_call
    # the same ops on the same weights (freezing's own folds, e.g. of the frontend's constants, round differently:
    # not bitwise)
    with torch.no_grad():
        ref = model(*x).float()
    for y in (out, frozen_out):
        assert (y.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
    assert (frozen_out.float() - out.float()).abs().max().item() <= 1e-2 * ref.abs().max().item()


def _frozen_dynamo_graph_values(model, x):
    """`graph_values` of the Dynamo graph of `model(*x)` traced under freezing (parameters as get_attr nodes)."""
    import torch._inductor.config as inductor_config

    from oasr_ops.families.quant_patterns import graph_values

    seen = []

    def capture(gm, example_inputs):
        seen.append((gm, graph_values(gm, example_inputs)))
        return gm.forward

    torch.compiler.reset()
    with torch.no_grad(), inductor_config.patch(freezing=True):
        torch.compile(model, backend=capture)(*x)
    (found,) = seen
    return found


def test_graph_values_sees_the_parameters_dynamo_emits_as_attributes_under_freezing():
    model = build_model("S", num_layers=1, dtype="fp16")
    x = example_inputs(2, 200, dtype="fp16", seed=5)
    gm, values = _frozen_dynamo_graph_values(model, x)
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert attrs, "under freezing Dynamo emits the parameters as get_attr"
    params = {id(p) for p in model.parameters()}
    assert params <= {id(v) for v in values.values()}  # every parameter, found as itself


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_in_graph_quantization_and_fusable_filter_under_freezing(scheme):
    """`options={"quantization": ...}` and `fusable_filter` find the weights whether Dynamo emits them as graph
    inputs or, under freezing, as attributes: before session 22 a frozen compile quantized nothing, silently."""
    import torch._inductor.config as inductor_config

    model = build_model("S", num_layers=1, dtype="fp16")
    x = example_inputs(2, 200, dtype="fp16", seed=5)
    with inductor_config.patch(freezing=True):
        frozen_pick = oasr_ops.fusable_filter(copy.deepcopy(model), *x)
    plain_pick = oasr_ops.fusable_filter(copy.deepcopy(model), *x)
    names = [fqn for fqn, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    chosen = [fqn for fqn in names if plain_pick(None, fqn)]
    assert chosen and chosen == [fqn for fqn in names if frozen_pick(None, fqn)]

    gemm = "oasr.scaled_mm.default" if scheme == "int8_w8a8" else "oasr.scaled_mm_fp8.default"
    every = dataclasses.replace(as_quant_config(scheme), layers="all")
    opts = {"quantization": every, "fuse_quantization": False}  # the pass's own graph (the fusion renames the GEMMs)
    out, ops, _ = _compiled(model, x, False, opts)
    frozen_out, frozen_ops, frozen_per_call = _compiled(model, x, True, opts)
    assert ops[gemm] >= 8 and frozen_ops == ops, (frozen_ops, ops)
    assert frozen_per_call == [], frozen_per_call  # the weight quantization: folded, once
    with torch.no_grad():
        ref = model(*x).float()
    assert (frozen_out.float() - out.float()).abs().max().item() <= 1e-2 * ref.abs().max().item()
