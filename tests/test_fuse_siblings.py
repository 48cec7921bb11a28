"""The backend's sibling-GEMM pass (`options={"fuse_siblings": True}`, inductor/fuse_siblings.py) on Dynamo graphs
of the example Whisper block and small q/k/v modules (CPU: traced and rewritten like on the GPU, the ops run their
references): int8 GEMMs sharing (a, scale_a, out_dtype, K) -> one `oasr.scaled_mm` on the concatenated weights,
each consumer reading its column slice.

Why the comparisons are exact: per output column the fused GEMM computes what the sibling's own GEMM did (the
exact int32 accumulator of the same int8 row and weight row, then ``scale_a * scale_w * acc + bias`` in fp32,
rounded once to the out_dtype; a missing bias is a zero, and ``y + 0 == y``), and everything after it reads the
same values (through a strided view instead of a contiguous tensor)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops.inductor import fuse_quant, fuse_siblings
from oasr_ops.inductor.backend import oasr_backend

from _fx_capture import Capture, calls, compile_captured

pytestmark = pytest.mark.usefixtures("fresh_inductor")

OPS = torch.ops.oasr
ON = {"fuse_quantization": True, "fuse_siblings": True}
OFF = {"fuse_quantization": True, "fuse_siblings": False}


def _whisper_block(d_model=64, heads=4):
    from examples.whisper import build_model

    model = build_model("tiny", num_layers=1, d_model=d_model, num_heads=heads).eval()
    return model.blocks[0]


def _quantized_calibrated(model, x):
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=oasr_ops.fusable_filter(model, x))
    oasr_ops.calibrate(q, [x])
    return q


def _both(model, x, on=ON, off=OFF):
    """(fused output, its post-grad graph, unfused output, its graph, the pass's reports of the fused compile)."""
    torch.compiler.reset()
    ref, g_ref = compile_captured(copy.deepcopy(model), x, **off)
    torch.compiler.reset()
    mark = fuse_siblings.SIBLING_LOG.mark()
    out, g = compile_captured(model, x, **on)
    return out, g, ref, g_ref, fuse_siblings.SIBLING_LOG.since(mark)


@pytest.mark.parametrize("batch,frames", [(1, 1), (1, 7), (1, 17), (2, 9)])
def test_whisper_block_qkv_become_one_gemm_bit_identical(batch, frames):
    torch.manual_seed(0)
    block = _whisper_block()
    x = torch.randn(batch, frames, 64, dtype=torch.float16)
    q = _quantized_calibrated(block, x)
    out, g, ref, g_ref, reps = _both(q, x)
    # unfused: q, k, v are three scaled_mm on one layer_norm_quant (fc1 / fc2 are act_quant / residual GEMMs)
    assert len(calls(g_ref, OPS.scaled_mm)) == 3
    fused, = calls(g, OPS.scaled_mm)
    assert fused.args[1].target is torch.ops.aten.cat.default and len(fused.args[1].args[0]) == 3
    assert fused.args[0].args[0].args[0].target is OPS.layer_norm_quant.default  # reshape(getitem(lnq, 0))
    # key has no bias: zeros of its width (from its weight) in the middle of the bias cat
    bias_parts = fused.args[4].args[0]
    assert bias_parts[0].op == bias_parts[2].op == "placeholder" and bias_parts[1].op == "call_function"
    assert bias_parts[1].meta["val"].shape == (64,) and bias_parts[1].meta["val"].dtype == torch.float16
    assert [(r.groups, r.widths, r.unfused) for r in reps] == [(1, [[64, 64, 64]], [])]
    assert torch.equal(out, ref)
    # and the int8 block stays close to the fp32 one (a sanity check of the whole path, not of the pass)
    with torch.no_grad():
        ref32 = copy.deepcopy(block).float()(x.float())
    assert (out.float() - ref32).abs().max().item() <= 5e-2 * ref32.abs().max().item()


class QKV(nn.Module):
    """q / k / v Linears after one LayerNorm (k without bias, as Whisper), read by pointwise consumers (exact:
    the outputs are the GEMMs' values times 2). `k_dtype` makes key a layer of that dtype (its GEMM writes it);
    `split_input` gives q its own LayerNorm; `return_k` returns k as it is; `k_in_place` modifies k in place;
    `flat_q` views q as [B, T * N]; `k_linear` feeds k to an fp16 Linear."""

    def __init__(self, d=64, biases=(True, False, True), k_dtype=None, split_input=False, return_k=False,
                 k_in_place=False, flat_q=False, k_linear=False):
        super().__init__()
        self.ln, self.ln_q = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v = (nn.Linear(d, n, bias=b) for n, b in zip((d, d, 2 * d), biases))
        self.k_dtype, self.split_input, self.return_k, self.k_in_place = k_dtype, split_input, return_k, k_in_place
        self.flat_q, self.k_linear = flat_q, k_linear
        self.k_out = nn.Linear(d, d)

    def forward(self, x):
        h = self.ln(x)
        q = self.q(self.ln_q(x) if self.split_input else h)
        k = self.k(h)  # a bf16 key layer reads the fp16 row too: its GEMM writes bf16, cast back to fp16
        if self.k_in_place:
            k.mul_(2)
        if self.k_linear:  # an fp16 linear reads k (as an attention out-projection would read its input)
            k = self.k_out(k)
        v = self.v(h)
        if self.flat_q:  # merges the rows with the columns: no view of a column slice can do that
            q = q.view(q.shape[0], -1)
        out = (q * 2, k if self.return_k else k * 2, v * 2)
        return tuple(t.float() for t in out)


def _qkv(**kw):
    torch.manual_seed(1)
    model = QKV(**kw).to(torch.float16).eval()
    if kw.get("k_dtype") is not None:
        model.k.to(kw["k_dtype"])
    return model


def _quantized(model, x):
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=lambda m, fqn: fqn != "k_out")
    oasr_ops.calibrate(q, [x])
    return q


@pytest.mark.parametrize("rows", [1, 7, 17])
@pytest.mark.parametrize("biases", [(True, False, True), (False, False, False)])
def test_outputs_exact_and_widths_follow_the_weights(rows, biases):
    x = torch.randn(rows, 64, dtype=torch.float16)
    model = _quantized(_qkv(biases=biases), x)
    out, g, ref, _g_ref, reps = _both(model, x)
    fused, = calls(g, OPS.scaled_mm)
    assert (fused.args[4] is None) is (not any(biases))  # all bias-less: no bias at all, not a cat of zeros
    assert [(r.groups, r.widths) for r in reps] == [(1, [[64, 64, 128]])]
    for o, r in zip(out, ref):
        assert torch.equal(o, r)


def test_a_view_a_column_slice_cannot_serve_becomes_a_reshape():
    x = torch.randn(3, 5, 64, dtype=torch.float16)
    model = _quantized(_qkv(flat_q=True), x)
    out, g, ref, _g_ref, reps = _both(model, x)
    assert len(calls(g, OPS.scaled_mm)) == 1
    assert reps[-1].views_to_reshape == 1 and out[0].shape == (3, 5 * 64)
    for o, r in zip(out, ref):
        assert torch.equal(o, r)


def test_dynamic_true_compiles_with_the_layer_norm_left_to_inductor():
    # dynamic=True makes the LayerNorm's eps a graph input (an `.item()` node): fuse_quant leaves that LayerNorm,
    # so q / k / v quantize separately and there is no shared int8 input to fuse on
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    model = _quantized(_qkv(), x)
    with torch.no_grad():
        out = torch.compile(model, backend=oasr_backend, options=ON, dynamic=True)(x)
        ref = model(x)
    for o, r in zip(out, ref):
        assert (o - r).abs().max().item() <= 2e-2 * r.abs().max().item()


def test_under_freezing_the_cats_fold_into_constants():
    # the global flag, set before compiling: Dynamo then emits the weights as get_attr nodes at their first use
    # (the pass hoists those too) and Inductor's constant folding turns every cat into a frozen parameter
    import torch._inductor.config as inductor_config

    torch.manual_seed(0)
    block = _whisper_block()
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    q = _quantized_calibrated(block, x)
    outs, graphs = {}, {}
    with inductor_config.patch(freezing=True):
        for sib in (False, True):
            torch.compiler.reset()
            cap = Capture()
            opts = {"fuse_quantization": True, "fuse_siblings": sib, "post_grad_custom_pre_pass": cap}
            with torch.no_grad():
                outs[sib] = torch.compile(copy.deepcopy(q), backend=oasr_backend, options=opts)(x)
            # freezing compiles its constant subgraph too: the model's graph is the one with the GEMMs
            graphs[sib] = next(g for g in cap.graphs if calls(g, OPS.layer_norm_quant))
    assert len(calls(graphs[False], OPS.scaled_mm)) == 3 and len(calls(graphs[True], OPS.scaled_mm)) == 1
    assert not calls(graphs[True], torch.ops.aten.cat)  # weight, scale and bias (key's zeros too) cats: constants
    assert torch.equal(outs[True], outs[False])


@pytest.mark.parametrize("siblings", [False, True])
def test_an_in_place_update_survives_the_passes(siblings):
    # regression: the passes' dead-code elimination took ``k.mul_(2)`` (a method call nobody reads) for dead code
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    model = _quantized(_qkv(k_in_place=True), x)
    out, _g = compile_captured(model, x, fuse_quantization=True, fuse_residual=True, fuse_siblings=siblings)
    with torch.no_grad():
        ref = model(x)
    for o, r in zip(out, ref):
        assert (o - r).abs().max().item() <= 2e-2 * r.abs().max().item()


def test_default_is_off():
    x = torch.randn(5, 64, dtype=torch.float16)
    model = _quantized(_qkv(), x)
    _out, g = compile_captured(model, x, fuse_quantization=True)
    assert len(calls(g, OPS.scaled_mm)) == 3


def _dynamo_graph(model, x):
    """Dynamo's graph of `model(x)` after fuse_quant + fuse_siblings, and the sibling report."""
    seen = []

    def capture(gm, example_inputs):
        fuse_quant.fuse_quantization(gm, layer_norms=True)
        seen.append(fuse_siblings.fuse_sibling_gemms(gm))
        seen.append(gm)
        return gm.forward

    with torch.no_grad():
        out = torch.compile(model, backend=capture)(x)
    return out, seen[-1], seen[-2]


def _scaled_mms(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (OPS.scaled_mm,
                                                                                  OPS.scaled_mm.default)]


def test_different_out_dtype_is_a_group_of_its_own():
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    model = _quantized(_qkv(k_dtype=torch.bfloat16), x)
    out, gm, rep = _dynamo_graph(model, x)
    assert rep.groups == 1 and rep.widths == [[64, 128]]  # q and v (fp16); k (bf16) alone
    gemms = _scaled_mms(gm)
    assert sorted(str(n.args[5]) for n in gemms) == ["torch.bfloat16", "torch.float16"]
    with torch.no_grad():
        ref = model(x)
    for o, r in zip(out, ref):
        assert torch.equal(o, r)


def test_different_input_is_not_fused():
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    model = _quantized(_qkv(split_input=True), x)
    _out, gm, rep = _dynamo_graph(model, x)
    assert rep.groups == 1 and rep.widths == [[64, 128]]  # k and v share ln(x); q reads ln_q(x)
    assert len(_scaled_mms(gm)) == 2


@pytest.mark.parametrize("kw,why", [({"return_k": True}, "returned by the graph"),
                                    ({"k_in_place": True}, "modified in place"),
                                    ({"k_linear": True}, "feeds a linear")])
def test_sites_left_with_why(kw, why):
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    model = _quantized(_qkv(**kw), x)
    out, gm, rep = _dynamo_graph(model, x)
    assert rep.groups == 1 and rep.widths == [[64, 128]]  # q and v still fused
    assert len(rep.unfused) == 1 and why in rep.unfused[0], rep.unfused
    assert len(_scaled_mms(gm)) == 2
    with torch.no_grad():
        ref = model(x)
    for o, r in zip(out, ref):
        assert torch.equal(o, r)


@pytest.mark.parametrize("configs,expected", [(("heuristic",) * 3, "heuristic"),
                                              (("heuristic", "default", "heuristic"), "auto")])
def test_config_kept_only_when_every_sibling_pinned_the_same(configs, expected):
    x = torch.randn(3, 64, dtype=torch.float16)
    model = _quantized(_qkv(), x)
    for lin, cfg in zip((model.q, model.k, model.v), configs):
        lin.config = cfg
    _out, gm, rep = _dynamo_graph(model, x)
    fused, = _scaled_mms(gm)
    assert fused.args[6] == expected


def test_options_quantization_path_fuses_too():
    x = torch.randn(2, 7, 64, dtype=torch.float16)
    model = _qkv()
    out, g = compile_captured(copy.deepcopy(model), x, quantization="int8_w8a8", **ON)
    torch.compiler.reset()
    ref, g_ref = compile_captured(model, x, quantization="int8_w8a8", **OFF)
    assert len(calls(g, OPS.scaled_mm)) == 1 and len(calls(g_ref, OPS.scaled_mm)) == 3
    for o, r in zip(out, ref):
        assert torch.equal(o, r)


def test_dynamic_rows_fuse_and_match_eager():
    block = _whisper_block()
    x0 = torch.randn(1, 5, 64, dtype=torch.float16)
    model = _quantized_calibrated(block, x0)
    mark = fuse_siblings.SIBLING_LOG.mark()
    # the frames dynamic, not everything: dynamic=True also makes the LayerNorm's eps a graph input, and then
    # fuse_quant leaves the LayerNorm (no layer_norm_quant: no shared int8 input)
    fn = torch.compile(model, backend=oasr_backend, options=ON)
    with torch.no_grad():
        for t in (5, 9, 13):
            x = torch.randn(2, t, 64, dtype=torch.float16)
            torch._dynamo.mark_dynamic(x, 1)
            out, ref = fn(x), model(x)
            # eager quantizes per token with the composite (not layer_norm_quant's kernel reference): close, and
            # the fusion's exactness is checked above against the unfused compile
            assert out.shape == ref.shape
            assert (out.float() - ref.float()).abs().max().item() <= 2e-2 * ref.float().abs().max().item()
    reps = fuse_siblings.SIBLING_LOG.since(mark)
    assert reps and all(r.groups == 1 and not r.unfused for r in reps)  # symbolic M: fused all the same


def test_the_option_is_checked():
    x = torch.randn(3, 64, dtype=torch.float16)
    model = _quantized(_qkv(), x)
    with pytest.raises(Exception, match=r"fuse_siblings'\] must be True or False"):
        with torch.no_grad():
            torch.compile(model, backend=oasr_backend, options={"fuse_siblings": "yes"})(x)
