"""The backend's residual fusion (`options={"fuse_residual": True}`, inductor/fuse_residual.py) on Dynamo graphs of
the example Conformer's blocks and small models (CPU: traced and rewritten like on the GPU, the ops run their
references): ``x + alpha * scaled_mm(...)`` -> ``oasr.scaled_mm_residual``; GEMM outputs with another user,
broadcast or promoted residuals are left alone."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops.inductor import fuse_quant, fuse_residual
from oasr_ops.inductor.backend import oasr_backend

from _fx_capture import Capture

pytestmark = pytest.mark.usefixtures("fresh_inductor")

OPS = torch.ops.oasr


def _calls(graph, op):
    """Calls of `op` (Dynamo's graph names the packet, the post-grad graph the overload)."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target in (op, op.default)]


def _dynamo_graph(model, *args, act=True):
    """Dynamo's graph of `model(*args)` after the backend's pre-AOT passes (act fusion, then the residual one)."""
    seen = []

    def capture(gm, example_inputs):
        if act:
            fuse_quant.fuse_quantization(gm, layer_norms=False)
        seen.append(fuse_residual.fuse_residual_adds(gm))
        seen.append(gm)
        return gm.forward

    with torch.no_grad():
        out = torch.compile(model, backend=capture)(*args)
    return out, seen[-1], seen[-2]


def _conformer(num_layers=1):
    from examples.conformer import build_model, example_inputs

    torch.manual_seed(0)
    model = build_model("S", num_layers=num_layers, dtype="fp16").eval()
    x, = example_inputs(batch=2, frames=64)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=oasr_ops.fusable_filter(model, x))
    oasr_ops.calibrate(q, [x])
    return model, q, x


def test_conformer_ffn_residuals_fuse_with_alpha_one_half():
    _model, q, x = _conformer()
    _out, gm, rep = _dynamo_graph(q, x)
    # the two macaron FFNs' fc2 (x + 0.5 * ff(x)); the attention out-projection and pointwise2 are fp16 Linears
    # (`fusable_filter` leaves them out) and stay as they were
    assert (rep.fused, rep.alphas, rep.unfused) == (2, [0.5, 0.5], [])
    res = _calls(gm.graph, OPS.scaled_mm_residual)
    assert len(res) == 2 and all(n.args[6] == 0.5 for n in res)
    # each fc2 reads the int8 hidden of its fc1's act-quant epilogue; its residual is the block's input stream
    for n in res:
        assert any(a.target is OPS.scaled_mm_act_quant.default for a in n.args[0].all_input_nodes)
        assert n.args[5].op == "call_method" and n.args[5].target == "reshape"
    assert len(_calls(gm.graph, OPS.scaled_mm)) == 2  # the other int8 GEMMs (QKV, pointwise1) remain scaled_mm


def test_conformer_through_the_backend_matches_the_unfused_graph():
    _model, q, x = _conformer()
    with torch.no_grad():
        ref = torch.compile(copy.deepcopy(q), backend=oasr_backend,
                            options={"fuse_quantization": "act", "fuse_residual": False})(x)
        torch.compiler.reset()
        cap = Capture()

        out = torch.compile(q, backend=oasr_backend, options={"fuse_quantization": "act", "fuse_residual": True,
                                                              "post_grad_custom_pre_pass": cap})(x)
    post = cap.graphs[-1]
    assert len(_calls(post, OPS.scaled_mm_residual)) == 2
    # the fused op skips the fp16 rounding of fc2's output before the add: within a few fp16 steps of the
    # unfused graph, relative to the output's scale
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err < 1e-2, err
    assert torch.isfinite(out).all()


class Residual(nn.Module):
    """x + alpha * linear(h) in several spellings; `extra_use` reads the GEMM output a second time."""

    def __init__(self, d=64, form="add", extra_use=False, broadcast=False, fp32_residual=False):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)
        self.form, self.extra_use, self.broadcast, self.fp32_residual = form, extra_use, broadcast, fp32_residual

    def forward(self, x):
        y = self.fc(self.ln(x))
        r = x[:1] if self.broadcast else x
        if self.fp32_residual:
            r = r.float()
        if self.form == "add":
            out = r + y
        elif self.form == "scaled_right":
            out = y * 0.25 + r
        else:  # "scaled_left"
            out = r + 0.5 * y
        return (out, y.sum()) if self.extra_use else out


def _quantized(model):
    return oasr_ops.quantize_(model.to(torch.float16).eval(), "int8_w8a8")


@pytest.mark.parametrize("form,alpha", [("add", 1.0), ("scaled_right", 0.25), ("scaled_left", 0.5)])
def test_both_operand_orders_and_alpha_spellings(form, alpha):
    torch.manual_seed(1)
    model = _quantized(Residual(form=form))
    x = torch.randn(3, 7, 64, dtype=torch.float16)
    with torch.no_grad():
        eager = model(x)
    out, gm, rep = _dynamo_graph(model, x, act=False)
    assert (rep.fused, rep.alphas) == (1, [alpha])
    res, = _calls(gm.graph, OPS.scaled_mm_residual)
    assert res.args[6] == alpha
    assert not _calls(gm.graph, OPS.scaled_mm)
    assert out.shape == eager.shape
    assert (out.float() - eager.float()).abs().max().item() <= 2e-2 * eager.float().abs().max().item()


@pytest.mark.parametrize("kw,why", [
    ({"extra_use": True}, "the GEMM output has another user"),
    ({"broadcast": True}, "broadcast or type promotion"),
    ({"fp32_residual": True}, "broadcast or type promotion"),
])
def test_not_fused_when_it_would_change_the_result_or_save_nothing(kw, why):
    torch.manual_seed(2)
    model = _quantized(Residual(**kw))
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    _out, gm, rep = _dynamo_graph(model, x, act=False)
    assert rep.fused == 0 and not _calls(gm.graph, OPS.scaled_mm_residual)
    assert len(rep.unfused) == 1 and why in rep.unfused[0], rep.unfused
    assert len(_calls(gm.graph, OPS.scaled_mm)) == 1


def test_options_quantization_path_fuses_the_same_way():
    torch.manual_seed(3)
    model = Residual(form="scaled_left").to(torch.float16).eval()
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    cap = Capture()

    with torch.no_grad():
        torch.compile(model, backend=oasr_backend, options={"quantization": "int8_w8a8", "fuse_residual": True,
                                                            "post_grad_custom_pre_pass": cap})(x)
    res, = _calls(cap.graphs[-1], OPS.scaled_mm_residual)
    assert res.args[6] == 0.5 and isinstance(res.args[8], str) and res.args[8] != "auto"  # the tile was baked


@pytest.mark.parametrize("options,fused", [
    ({}, True),                                                    # the defaults: quantization fusion on
    ({"fuse_quantization": False}, False),                         # no quantization fusion: off
    ({"fuse_quantization": "act"}, True),                          # on by default with it
    ({"fuse_quantization": True}, True),
    ({"fuse_quantization": "act", "fuse_residual": False}, False),  # explicitly off
    ({"fuse_quantization": False, "fuse_residual": True}, True),   # explicitly on, alone
])
def test_default_follows_fuse_quantization(options, fused):
    torch.manual_seed(4)
    model = _quantized(Residual())
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    cap = Capture()

    with torch.no_grad():
        torch.compile(model, backend=oasr_backend, options={**options, "post_grad_custom_pre_pass": cap})(x)
    assert bool(_calls(cap.graphs[-1], OPS.scaled_mm_residual)) is fused
    assert bool(_calls(cap.graphs[-1], OPS.scaled_mm)) is not fused


def test_the_option_is_checked():
    model = _quantized(Residual())
    with pytest.raises(Exception, match=r"fuse_residual'\] must be True or False"):
        with torch.no_grad():
            torch.compile(model, backend=oasr_backend, options={"fuse_residual": "yes"})(
                torch.randn(2, 5, 64, dtype=torch.float16))


def test_dynamic_shapes_fuse_and_match_eager():
    torch.manual_seed(5)
    model = _quantized(Residual(form="scaled_left"))
    mark = fuse_residual.RESIDUAL_LOG.mark()
    fn = torch.compile(model, backend=oasr_backend, options={"fuse_residual": True}, dynamic=True)
    with torch.no_grad():
        for t in (5, 9, 13):
            x = torch.randn(2, t, 64, dtype=torch.float16)
            out, ref = fn(x), model(x)
            assert out.shape == ref.shape
            assert (out.float() - ref.float()).abs().max().item() <= 2e-2 * ref.float().abs().max().item()
    reps = fuse_residual.RESIDUAL_LOG.since(mark)
    assert reps and all(r.fused == 1 and not r.unfused for r in reps)  # symbolic M: fused all the same


def test_conformer_with_every_linear_int8_fuses_attention_and_conv_module_adds_too():
    """Without `fusable_filter` the attention out-projection and pointwise2 are int8 as well: their adds
    (``x + mhsa(x)``, ``x + conv(x)``, alpha 1) fuse like the FFNs' (alpha 0.5)."""
    from examples.conformer import build_model, example_inputs

    torch.manual_seed(0)
    model = build_model("S", num_layers=1, dtype="fp16").eval()
    x, = example_inputs(batch=2, frames=64)
    q = oasr_ops.quantize_(model, "int8_w8a8")
    _out, gm, rep = _dynamo_graph(q, x, act=False)
    assert (rep.fused, rep.alphas) == (4, [0.5, 1.0, 1.0, 0.5])
    # the frontend's output projection plus the positional table (15, 256), broadcast over the batch: left alone
    assert len(rep.unfused) == 1 and "is not exactly the output's (2, 15, 256)" in rep.unfused[0], rep.unfused
    assert len(_calls(gm.graph, OPS.scaled_mm_residual)) == 4
