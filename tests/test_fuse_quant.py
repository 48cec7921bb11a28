"""The backend's quantization fusion on real torch.compile graphs (CPU: the graph is traced and rewritten like on
the GPU; the ops run their references): LayerNorm -> oasr.layer_norm_quant, fc1 -> GELU/SiLU -> fc2 with fc2
calibrated -> oasr.scaled_mm_act_quant feeding fc2; no node re-reads an activation only to quantize it."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops.inductor import fuse_quant
from oasr_ops.inductor.backend import oasr_backend

from _fx_capture import Capture, ancestors as _ancestors, calls, compile_captured

pytestmark = pytest.mark.usefixtures("fresh_inductor")

OPS = torch.ops.oasr


class Block(nn.Module):
    """Pre-LN transformer FFN (+ an attention-like projection whose input is no LayerNorm)."""

    def __init__(self, d=64, act=nn.GELU, proj=False) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d), act(), nn.Linear(4 * d, d)
        self.proj = nn.Linear(d, d) if proj else None

    def forward(self, x):
        y = x + self.fc2(self.act(self.fc1(self.ln(x))))
        return y + self.proj(torch.tanh(y)) if self.proj is not None else y


def _compile(model, x, **options):
    options.setdefault("fuse_quantization", True)  # opt-in (backend.py)
    options.setdefault("fuse_residual", False)  # on with fuse_quantization by default; these tests look at fc2 itself
    return compile_captured(model, x, **options)


_calls = calls


def _assert_fused_ffn(graph, act):
    x = [n for n in graph.nodes if n.op == "placeholder"]
    lnq, = _calls(graph, OPS.layer_norm_quant)
    aq, = _calls(graph, OPS.scaled_mm_act_quant)
    assert aq.args[6] == act
    # fc1's 16-bit bias goes to the kernel as it is (no fp32 cast kernel per call)
    assert aq.args[4].op in ("placeholder", "get_attr"), aq.args[4].format_node()
    assert lnq in _ancestors(aq)  # fc1 reads the LayerNorm's int8 row and scale
    fc2 = [n for n in _calls(graph, OPS.scaled_mm) if aq in n.all_input_nodes]
    assert len(fc2) == 1 and fc2[0].args[0] is aq  # fc2 reads fc1's int8 output directly
    # No node re-reads an activation only to quantize it: every amax left (the in-graph weight quantization of
    # the options path) reduces a weight, never anything computed from the input x.
    act_input = next(n for n in x if n in lnq.all_input_nodes or n in _ancestors(lnq))
    for n in graph.nodes:
        if n.op == "call_function" and n.target in (torch.ops.aten.amax.default, torch.ops.aten.max.dim):
            assert act_input not in _ancestors(n), f"{n} quantizes an activation"
    assert not _calls(graph, OPS.quantize_per_token) and not _calls(graph, OPS.scaled_mm_quant)


@pytest.mark.parametrize("act,name", [(nn.GELU, "gelu"), (nn.SiLU, "silu")])
def test_options_quantization_fuses_layer_norm_and_fc1_activation(act, name):
    torch.manual_seed(0)
    model = Block(act=act).to(torch.float16).eval()
    x = torch.randn(2, 33, 64, dtype=torch.float16)
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(x.float())
    oasr_ops.calibrate(model, [torch.randn(2, 33, 64, dtype=torch.float16) for _ in range(4)] + [x])
    out, graph = _compile(model, x, quantization="int8_w8a8")
    _assert_fused_ffn(graph, name)
    rep = fuse_quant.fuse_log()[-1]
    assert (rep.layer_norm_quant, rep.act_quant, rep.unfused) == (1, 1, [])
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < 5e-2, err


def test_quantize_then_calibrate_fuses_the_same_way_and_matches_the_ops():
    torch.manual_seed(1)
    model = Block().to(torch.bfloat16).eval()
    x = torch.randn(3, 17, 64, dtype=torch.bfloat16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    oasr_ops.calibrate(q, [x])
    out, graph = _compile(q, x)
    _assert_fused_ffn(graph, "gelu")
    assert not [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.amax.default]
    # the fused graph computes exactly what its ops compute when called one by one
    with torch.no_grad():
        qq, s, _ = oasr_ops.layer_norm_quant(x.contiguous(), q.ln.weight, q.ln.bias, q.ln.eps)
        h = oasr_ops.scaled_mm_act_quant(qq.reshape(-1, 64), q.fc1.weight_q, s, q.fc1.scale_w, q.fc2.input_scale,
                                         "gelu", bias=q.fc1.bias.float())
        y = oasr_ops.scaled_mm(h, q.fc2.weight_q, q.fc2.input_scale, q.fc2.scale_w, q.fc2.bias, torch.bfloat16)
        want = x + y.reshape(x.shape)
    assert torch.equal(out, want)


def test_without_calibration_the_layer_norm_fuses_and_fc2_stays_dynamic(monkeypatch):
    from oasr_ops.inductor import backend
    from oasr_ops.runtime.plans import WarnOnce

    model = Block().to(torch.float16).eval()
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    monkeypatch.setattr(backend, "_warn_once", WarnOnce())  # its once-per-process memory, fresh for this test
    with pytest.warns(UserWarning, match=r"1 quantized layer input\(s\) keep a separate quantization pass "
                                         r"\(.*gelu.*calibrate.*fusable_filter"):
        _out, graph = _compile(q, x)
    assert len(_calls(graph, OPS.layer_norm_quant)) == 1 and not _calls(graph, OPS.scaled_mm_act_quant)
    rep = fuse_quant.fuse_log()[-1]
    assert rep.act_quant == 0 and len(rep.unfused) == 1 and "gelu" in rep.unfused[0]
    # calibrated, everything fuses: no such warning
    oasr_ops.calibrate(q, [x])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compile(q, x)
    assert not [w for w in seen if "separate quantization pass" in str(w.message)], [str(w.message) for w in seen]


def test_layer_norm_with_another_consumer_writes_the_normalized_row():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc = nn.LayerNorm(64), nn.Linear(64, 64)

        def forward(self, x):
            h = self.ln(x)
            return self.fc(h) + h

    m = oasr_ops.quantize_(Two().half().eval(), "int8_w8a8")
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    out, graph = _compile(m, x)
    lnq, = _calls(graph, OPS.layer_norm_quant)
    assert lnq.args[4] is True
    with torch.no_grad():
        assert torch.equal(out, m(x))  # dynamic per token both ways: the same ops, the same bits


@pytest.mark.parametrize("regroup", ["merge", "split"])
def test_a_reshape_that_changes_the_row_width_leaves_the_layer_norm_unfused(regroup):
    """LayerNorm over C, then a reshape to rows of 2C (or C/2) before the Linear: the LayerNorm's per-row scales
    are not the quantization's. Fusing it failed the compile (K mismatch); it is left unfused, and said."""

    class Regroup(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(32)
            self.fc = nn.Linear(64 if regroup == "merge" else 16, 64)

        def forward(self, x):
            b, t, c = x.shape
            h = self.ln(x)
            return self.fc(h.reshape(b, t // 2, 2 * c) if regroup == "merge" else h.reshape(b, t, 2, c // 2))

    m = oasr_ops.quantize_(Regroup().half().eval(), "int8_w8a8")
    x = torch.randn(2, 10, 32, dtype=torch.float16)
    out, graph = _compile(m, x)
    assert not _calls(graph, OPS.layer_norm_quant)
    assert any("rows of another width" in u for u in fuse_quant.fuse_log()[-1].unfused)
    with torch.no_grad():
        want = m(x)
    # not bitwise: Inductor keeps the LayerNorm's output in fp32 into the quantization, eager rounds it to fp16
    assert float((out.float() - want.float()).abs().max() / want.float().abs().max()) < 2e-2


def test_fuse_quantization_option_off_keeps_the_unfused_graph():
    q = oasr_ops.quantize_(Block().half().eval(), "int8_w8a8")
    _out, graph = _compile(q, torch.randn(2, 5, 64, dtype=torch.float16), fuse_quantization=False)
    assert not _calls(graph, OPS.layer_norm_quant)


@pytest.mark.parametrize("fuse", [None, False])
def test_fusion_is_on_by_default_and_false_turns_it_off(fuse):
    # on unless turned off since session 33 (the bare scheme string: 1.31x unfused, 1.74x fused; docs/perf/e2e.md)
    torch._dynamo.reset()
    q = oasr_ops.quantize_(Block().half().eval(), "int8_w8a8")
    cap = Capture()
    options = {"post_grad_custom_pre_pass": cap} | ({} if fuse is None else {"fuse_quantization": fuse})
    with torch.no_grad():
        torch.compile(q, backend=oasr_backend, options=options)(torch.randn(2, 5, 64, dtype=torch.float16))
    assert bool(_calls(cap.graphs[-1], OPS.layer_norm_quant)) == (fuse is None)
    assert _calls(cap.graphs[-1], torch.ops.oasr.scaled_mm)  # int8 either way


def test_fusable_layers_leave_out_the_projection_after_no_norm():
    model = Block(proj=True).half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    flt = oasr_ops.fusable_filter(model, x)
    chosen = {fqn for fqn, m in model.named_modules() if isinstance(m, nn.Linear) and flt(m, fqn)}
    assert chosen == {"fc1", "fc2"}
    oasr_ops.calibrate(model, [x])
    _out, graph = _compile(model, x, quantization=oasr_ops.Int8W8A8Config(layers="fusable"))
    assert len(_calls(graph, OPS.scaled_mm)) == 1  # fc2; proj stays fp16 (an aten mm)
    assert len(_calls(graph, OPS.scaled_mm_act_quant)) == 1


def test_calibrating_a_compiled_model_calibrates_the_module_it_wraps():
    """calibrate(torch.compile(m), ...) ran the compiled graph, which runs no hooks: it stored nothing and returned
    {}. It calibrates the wrapped module (eagerly) now."""
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(Block().half().eval(), "int8_w8a8")
    compiled = torch.compile(q, backend=oasr_backend)
    scales = oasr_ops.calibrate(compiled, [x])
    assert set(scales) == {"fc1", "fc2"} and q.fc1.calibrated


def test_recalibrating_a_plain_model_after_compiling_it_says_the_graph_keeps_the_old_scales():
    """options={"quantization": ...} bakes a plain layer's calibrated scale into the graph it compiles; calibrating
    again changes what the next compile bakes, not that graph: one warning says so (it was silent)."""
    model = Block().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    oasr_ops.calibrate(model, [x * 0.01])
    _out, _graph = _compile(model, x, quantization="int8_w8a8", fuse_quantization="act")
    with pytest.warns(UserWarning, match="compiled with their previous scales.*compile again"):
        oasr_ops.calibrate(model, [x])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        oasr_ops.calibrate(Block().half().eval(), [x])  # never compiled: silent
        oasr_ops.calibrate(model, [x])  # the same amax again: nothing stale, silent


def test_a_graph_reused_for_another_instance_with_other_calibrated_scales_raises_instead_of_running_wrong():
    """Dynamo reuses a compiled graph for another instance of the same class when the backends compare equal
    (equal options). The weights are graph inputs (the second model's flow in); the calibrated scales
    `options={"quantization": ...}` baked are the first model's: the second ran silently wrong (1.5e-1 vs fp32
    instead of 1.6e-2, session 32). The graph now checks the weights it receives; an instance with the same
    calibration runs, one with another raises naming the layer; a reset compiles each model its own graph."""
    torch.manual_seed(0)
    first = Block().to(torch.bfloat16).eval()
    same, other = copy.deepcopy(first), copy.deepcopy(first)
    with torch.no_grad():
        other.fc1.weight.mul_(10)  # fc2's input 10x larger: its calibrated scale 10x
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    for m in (first, same, other):
        oasr_ops.calibrate(m, [x])
    opts = {"quantization": oasr_ops.Int8W8A8Config(layers="fusable"), "fuse_quantization": True}
    with torch.no_grad():
        want_first = torch.compile(first, backend=oasr_backend, options=dict(opts))(x)
        got_same = torch.compile(same, backend=oasr_backend, options=dict(opts))(x)  # same scales: runs
        torch.testing.assert_close(got_same, want_first, rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="baked the calibrated input scale .* another module's weight"):
            torch.compile(other, backend=oasr_backend, options=dict(opts))(x)
        torch.compiler.reset()
        got_other = torch.compile(other, backend=oasr_backend, options=dict(opts))(x)
        ref = other.float()(x.float())
    assert (got_other.float() - ref).abs().max() / ref.abs().max() < 3e-2


def test_calibration_round_trips_through_the_state_dict():
    model = Block().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    scales = oasr_ops.calibrate(q, [x, x * 2])
    assert set(scales) == {"fc1", "fc2"}
    with torch.no_grad():
        assert scales["fc1"] == pytest.approx(float(q.ln(x * 2).abs().max()) / 127, rel=1e-3)
    fresh = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    assert fresh.fc2.input_scale is None
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh.fc2.input_scale, q.fc2.input_scale) and "calibrated=True" in repr(fresh.fc2)
    with pytest.raises(ValueError, match="no batches"):
        oasr_ops.calibrate(q, [])


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8", None], ids=["int8", "fp8", "plain"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_calibration_on_a_batch_with_nan_or_inf_stores_nothing_and_says_so(scheme, bad):
    """One corrupted batch (or an fp16 overflow before a layer) used to store NaN / inf scales silently: every later
    output of the quantized model was then NaN or zero. Now a ValueError names the layers; no scale is stored."""
    from oasr_ops.families.scaled_mm.calibrate import calibrated_scale

    model = Block().half().eval()
    q = oasr_ops.quantize_(copy.deepcopy(model), scheme) if scheme else copy.deepcopy(model)
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    poisoned = x.clone()
    poisoned[1, 3, 7] = bad
    with pytest.raises(ValueError, match=r"inputs of 2 layer\(s\) held NaN or inf.*fc1, fc2"):
        oasr_ops.calibrate(q, [x, poisoned])
    if scheme:
        assert q.fc1.input_scale is None and q.fc2.input_scale is None
    else:
        assert calibrated_scale(q.fc1.weight) is None and calibrated_scale(q.fc2.weight) is None
    assert set(oasr_ops.calibrate(q, [x])) == {"fc1", "fc2"}  # the clean batch alone calibrates both


def test_a_layer_that_saw_only_zeros_stays_uncalibrated_with_one_warning():
    """A zero amax used to store a ~1e-14 scale, saturating every later input of that layer to +-127."""
    model = Block().half().eval()  # LayerNorm of zeros is its bias, zeros: fc1 sees zeros, fc2 act(fc1.bias)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    with pytest.warns(UserWarning, match=r"1 layer\(s\) were all zeros in every batch \(fc1\)"):
        scales = oasr_ops.calibrate(q, [torch.zeros(2, 5, 64, dtype=torch.float16)])
    assert set(scales) == {"fc2"} and q.fc1.input_scale is None and q.fc2.input_scale is not None


def test_quant_linear_state_dict_of_the_earlier_layout_loads():
    """`scale_w` / `input_scale` were separate buffers before they were packed into `scales`: such a checkpoint
    loads into the packed layout with the same values and the same calibration state."""
    model = Block().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    oasr_ops.calibrate(q, [x])
    old = {}
    for k, v in q.state_dict().items():
        name, _, leaf = k.rpartition(".")
        layer = q.get_submodule(name) if name else q
        if not isinstance(layer, oasr_ops.QuantLinear) or leaf in ("weight_q", "bias"):
            old[k] = v
        elif leaf == "scales":
            old[f"{name}.scale_w"] = layer.scale_w.clone()
            if layer.input_scale is not None:
                old[f"{name}.input_scale"] = layer.input_scale.clone()
    assert not any(k.endswith("scales") or k.endswith("_extra_state") for k in old)
    fresh = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    fresh.load_state_dict(old)  # strict
    for name in ("fc1", "fc2"):
        a, b = getattr(fresh, name), getattr(q, name)
        assert torch.equal(a.scale_w, b.scale_w) and torch.equal(a.input_scale, b.input_scale)
    with torch.no_grad():
        assert torch.equal(fresh(x), q(x))


def test_calibrated_quant_linear_is_three_graph_inputs():
    """Host time per call grows with the tensors a compiled model fetches from its modules (docs/perf/e2e.md):
    a calibrated layer brings its int8 weight, one fp32 buffer (weight scales + input scale) and its bias."""
    lin = nn.Linear(64, 32).half()
    q = oasr_ops.quantize_(nn.Sequential(lin), "int8_w8a8")
    x = torch.randn(3, 64, dtype=torch.float16)
    oasr_ops.calibrate(q, [x])
    seen = []

    def capture(gm, example_inputs):
        seen.append([n for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(q, backend=capture)(x)
    assert len(seen) == 1 and len(seen[0]) == 1 + 3  # x, weight_q, scales, bias
    q[0].input_scale = None
    assert q[0].input_scale is None and "calibrated=False" in repr(q[0])
    with pytest.raises(ValueError, match="one value per tensor"):
        q[0].input_scale = torch.ones(2)


def test_fuse_quantization_act_only_leaves_the_layer_norm_to_inductor():
    torch.manual_seed(0)
    model = Block(act=nn.SiLU).to(torch.float16).eval()
    x = torch.randn(2, 33, 64, dtype=torch.float16)
    oasr_ops.calibrate(model, [x])
    out, graph = _compile(model, x, quantization="int8_w8a8", fuse_quantization="act")
    assert not _calls(graph, OPS.layer_norm_quant)
    aq, = _calls(graph, OPS.scaled_mm_act_quant)
    assert aq.args[6] == "silu"
    rep = fuse_quant.fuse_log()[-1]
    assert (rep.layer_norm_quant, rep.act_quant, rep.unfused) == (0, 1, [])
    # the LayerNorm's quantization is still in the graph, decomposed for Inductor to fuse with the LayerNorm
    assert any(n.op == "call_function" and n.target is torch.ops.aten.amax.default for n in graph.nodes)
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(x.float())
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 5e-2


def test_fuse_quantization_rejects_an_unknown_value():
    q = oasr_ops.quantize_(Block().half().eval(), "int8_w8a8")
    with pytest.raises(Exception, match="fuse_quantization"):
        _compile(q, torch.randn(2, 5, 64, dtype=torch.float16), fuse_quantization="layernorm")


def _session6_state_dict(q: nn.Module) -> dict:
    """The layout of session 6: `scales` always [N + 1] (the last entry 1.0 until calibrated), a `calibrated` flag
    in `_extra_state`, and no `bias` entry for a layer without bias."""
    old = {}
    for k, v in q.state_dict().items():
        name, _, leaf = k.rpartition(".")
        layer = q.get_submodule(name) if name else q
        if not isinstance(layer, oasr_ops.QuantLinear):
            old[k] = v
        elif leaf == "scales":
            tail = layer.input_scale if layer.calibrated else torch.ones(1)
            old[k] = torch.cat([layer.scale_w, tail])
            old[f"{name}._extra_state"] = {"calibrated": layer.calibrated}
        elif leaf != "bias" or layer.bias.shape[0]:
            old[k] = v
    return old


@pytest.mark.parametrize("calibrated", [False, True])
def test_quant_linear_state_dict_of_session_6_loads(calibrated):
    model = Block().half().eval()
    model.fc2 = nn.Linear(256, 64, bias=False).half()  # a layer without bias: no `bias` entry in that layout
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    if calibrated:
        oasr_ops.calibrate(q, [x])
    old = _session6_state_dict(q)
    assert "fc2.bias" not in old and old["fc1.scales"].shape == (257,)
    fresh = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    fresh.load_state_dict(old)  # strict
    for name in ("fc1", "fc2"):
        a, b = getattr(fresh, name), getattr(q, name)
        assert a.calibrated is calibrated and torch.equal(a.scale_w, b.scale_w)
        assert (a.input_scale is None) if not calibrated else torch.equal(a.input_scale, b.input_scale)
    assert fresh.fc2.bias.shape == (0,) and fresh.fc2.out_dtype == torch.float16
    with torch.no_grad():
        assert torch.equal(fresh(x), q(x))


def test_input_scale_can_be_cleared_and_set_again():
    q = oasr_ops.quantize_(nn.Linear(64, 32).half(), "int8_w8a8")
    assert not q.calibrated and q.scales.shape == (32,)
    q.input_scale = torch.tensor([0.5])
    assert q.calibrated and q.scales.shape == (33,) and float(q.input_scale) == 0.5
    q.input_scale = None
    assert not q.calibrated and q.input_scale is None and q.scales.shape == (32,)
    with pytest.raises(ValueError, match="one value per tensor"):
        q.input_scale = torch.ones(2)


def test_quant_linear_guards_are_tag_safe():
    """What QuantLinear.forward reads is buffers and class attributes only, so with Dynamo's recursive dict-tag
    guards its guard subtree can be skipped while its dicts are unchanged (the host-time reason: class doc)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model = oasr_ops.quantize_(Block().half().eval(), "int8_w8a8")
    oasr_ops.calibrate(model, [torch.randn(2, 5, 64, dtype=torch.float16)])
    x = torch.randn(2, 5, 64, dtype=torch.float16)

    def null_backend(gm, example_inputs):
        return gm.forward

    torch._dynamo.reset()
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True), torch.no_grad():
        torch.compile(model, backend=null_backend)(x)
    guards = str(_debug_get_cache_entry_list(type(model).forward.__code__)[0].guard_manager)
    torch._dynamo.reset()
    layers = [ln for ln in guards.splitlines() if "GuardManager: source=" in ln
              and "type=<class 'oasr_ops.families.scaled_mm.quantize.QuantLinear'>" in ln]
    assert len(layers) == 2 and all("tag_safe=(True" in ln for ln in layers), layers


def test_a_compiled_graph_reads_its_calibrated_out_scale_on_the_first_call_only(monkeypatch):
    """Without CUDA graphs a compiled graph passes a fresh alias of fc2's `scales` buffer to the act-quant op on
    every call; its value check (a device sync on the GPU) must read it once (families/scaled_mm/out_scale.py)."""
    from oasr_ops.families.scaled_mm import out_scale

    model = Block().to(torch.float16).eval()
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    oasr_ops.calibrate(q, [x])
    fn = torch.compile(q, backend=oasr_backend, options={"fuse_quantization": True, "fuse_residual": False})
    reads = []
    real = out_scale._values_ok
    monkeypatch.setattr(out_scale, "_values_ok", lambda s: reads.append(s.data_ptr()) or real(s))
    with torch.no_grad():
        first = fn(x)
        n_first = len(reads)
        for _ in range(3):
            assert torch.equal(fn(x), first)
    assert n_first >= 1 and len(reads) == n_first, reads
    with torch.no_grad():  # an eager in-place change is still caught on the next eager call
        q.fc2.scales[-1] = 0.0
        with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
            out_scale.check_out_scale(q.fc2.scales[-1:])


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_a_linear_called_with_keywords_is_quantized_and_fused(scheme):
    """Dynamo keeps the keywords of F.linear(x, weight=w, bias=b); the passes read the operands by position and
    raised IndexError. Such a call is quantized (and fused) like a positional one."""

    class KwBlock(Block):
        def forward(self, x):
            h = nn.functional.linear(input=self.ln(x), weight=self.fc1.weight, bias=self.fc1.bias)
            return x + self.fc2(self.act(h))  # a module call: calibrate's hook sees fc2's input

    torch.manual_seed(0)
    model = KwBlock().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    oasr_ops.calibrate(model, [x], scheme=scheme)
    with torch.no_grad():
        want = model(x)
    out, graph = _compile(model, x, quantization=scheme)
    assert _calls(graph, OPS.layer_norm_quant)
    assert _calls(graph, OPS.scaled_mm_act_quant if scheme == "int8_w8a8" else OPS.scaled_mm_fp8_act_quant)
    tol = 0.03 if scheme == "int8_w8a8" else 0.08
    assert float((out.float() - want.float()).norm() / (want.float() - x.float()).norm()) < tol
    assert fuse_quant.fusable_filter(model, x)(model.fc1, "fc1")  # fusable_filter reads the same calls
