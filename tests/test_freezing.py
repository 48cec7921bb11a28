"""`backend="oasr"` under Inductor's freezing (``torch._inductor.config.freezing = True``, the common inference
setting): the same oasr sites as without it, and no per-call work left on the weights.

Freezing's constant folding runs before the post-grad passes and turns every Linear's ``permute(W, [1, 0])`` into
a constant; the gemm matcher (and the frontend's copy-free flatten) used to see no permute there and left every
fp16 Linear on aten (found on the H200 in session 22: the frozen int8 Conformer lost its 17 `oasr::gemm` sites
and launched 41 more kernels per call). The weight transforms the rewrite itself inserts (KRSC conv weights, the
frontend's column-permuted Linear weight, the depthwise conv's fp32 BatchNorm scale) are folded once, after it.
On the CPU: the real compile, passes and CPU reference ops (which check the weight layout as CUDA does).
"""
from __future__ import annotations

import collections
import copy

import pytest
import torch

import oasr_ops
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
