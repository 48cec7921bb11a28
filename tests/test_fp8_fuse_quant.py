"""The fp8 counterpart of `fuse_quantization="act"` on the CPU: oasr::scaled_mm_fp8_act_quant (reference vs an
independent float64 computation, fake, opcheck, checks), its kernel variants (the fp8 activation branch shares the
int8 template's fast-math snippet; the other variants render unchanged; sm89 refuses them), the selection and the
rewrite's config baking, calibration for fp8 layers, and the fusion pass on real torch.compile graphs (a
`LayerNorm -> fc1 -> GELU -> fc2` block and the example Conformer). The ops run their references here; the kernels
are checked by tests/test_fp8_fuse_quant_gpu.py."""
from __future__ import annotations

import copy
import ctypes
import math
import shutil

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import oasr_ops
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse
from oasr_ops.families.scaled_mm_fp8 import act_quant
from oasr_ops.families.scaled_mm_fp8.lanes import SM89_FP8_MMA as SM89
from oasr_ops.families.scaled_mm_fp8.lanes import SM90_FP8_WGMMA as SM90
from oasr_ops.families.scaled_mm_fp8.reference import FP8, e4m3_steps, quantize_per_token_fp8, quantize_weight_fp8
from oasr_ops.inductor import fuse_quant

from _act_envelope import assert_in_envelope, e4m3_envelope, fit_error
from _fx_capture import ancestors as _ancestors, calls, compile_captured

OPS = torch.ops.oasr


def _operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a, sa = quantize_per_token_fp8(torch.randn(m, k, generator=g))
    w, sw = quantize_weight_fp8(torch.randn(n, k, generator=g))
    bias = torch.randn(n, generator=g)
    return a, w, sa, sw, bias


def _exact(a, w, sa, sw, bias, out_scale, act):
    """Independent of the op's code: float64 throughout, the activation from its definition; (y, act(y) / s)."""
    y = sa.double()[:, None] * sw.double()[None, :] * (a.double() @ w.double().t())
    if bias is not None:
        y = y + bias.double()
    z = 0.5 * y * (1 + torch.erf(y / math.sqrt(2))) if act == "gelu" else y * torch.sigmoid(y)
    return y, z / out_scale.double().reshape(-1, 1)


def _assert_within_the_fit(got, a, w, sa, sw, bias, out_scale, act, min_equal=0.95):
    """The CPU op (the reference: the fitted GELU, exact tanh) against the exact activation: inside the envelope of
    the fit's error (tests/_act_envelope.py; plus fp32 rounding of y), which for e4m3 allows more than one step
    only among the tiny negative-tail outputs, whose steps are smaller than the fit's absolute error; most values
    equal (the fit's error is far below half a step wherever |act(y)| / s is not tiny)."""
    y, v = _exact(a, w, sa, sw, bias, out_scale, act)
    s = out_scale.double().reshape(-1, 1)
    lo, hi = e4m3_envelope(v, (fit_error(y, act) + 2.0 ** -20 * y.abs()) / s)
    assert_in_envelope(got.float(), lo, hi, act)
    d = e4m3_steps(got, v.clamp(-448, 448).to(FP8))
    assert (d == 0).float().mean().item() >= min_equal


@pytest.mark.parametrize("m", [1, 7, 17, 127, 1000])
@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_reference_matches_float64(m, act, with_bias):
    a, w, sa, sw, bias = _operands(m, 64, 96, m)
    bias = bias if with_bias else None
    out_scale = torch.tensor([0.02])  # a few values saturate at 448, most do not
    q = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, act, bias=bias)
    assert q.dtype == FP8 and q.shape == (m, 64)
    _assert_within_the_fit(q, a, w, sa, sw, bias, out_scale, act)
    assert not torch.isnan(q.float()).any()  # saturated, never NaN (torch's own cast maps overflow to NaN)
    # the op is the plain quantizing op's value with the activation between the bias and the quantization
    y = act_quant.epilogue_fp32(act_quant.acc64(a, w), sa, sw, bias)
    assert torch.equal(q.view(torch.uint8), act_quant.act_quant_fp8(y, out_scale, act).view(torch.uint8))


def test_per_row_out_scale_and_leading_dims():
    a, w, sa, sw, _ = _operands(12, 32, 48, 3)
    out_scale = torch.rand(12) * 0.05 + 0.01
    q = oasr_ops.scaled_mm_fp8_act_quant(a.reshape(3, 4, 48), w, sa, sw, out_scale, "silu")
    assert q.shape == (3, 4, 32)
    _assert_within_the_fit(q.reshape(12, 32), a, w, sa, sw, None, out_scale, "silu")


def test_e4m3_steps_counts_representable_values():
    v = torch.tensor([0.0, -0.0, 448.0, -448.0, 1.0, 1.125, -0.001953125], dtype=torch.float32).to(FP8)
    w = torch.tensor([-0.0, 0.001953125, 416.0, 448.0, 1.125, 1.0, 0.001953125], dtype=torch.float32).to(FP8)
    assert e4m3_steps(v, w).tolist() == [0, 1, 1, 252, 1, 1, 2]


def test_activation_tails_and_saturation():
    # |y| up to ~60: SiLU -> -0 and GELU -> 0 far below 0, -> y far above; with a small scale most saturate at 448
    a, w, sa, sw, bias = _operands(64, 32, 256, 9)
    sa, sw = sa * 8, sw * 8
    for act in ("gelu", "silu"):
        for s in (0.5, 0.01):
            out_scale = torch.tensor([s])
            q = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, act, bias=bias)
            _assert_within_the_fit(q, a, w, sa, sw, bias, out_scale, act)
            assert q.float().abs().max().item() <= 448


@pytest.mark.parametrize("m", [1, 17])
def test_opcheck_and_fake(m):
    a, w, sa, sw, bias = _operands(m, 32, 48, 1)
    # test_schema is left out: its mutation check multiplies the inputs, which torch does not implement for e4m3
    torch.library.opcheck(OPS.scaled_mm_fp8_act_quant.default, (a, w, sa, sw, bias, torch.ones(1), "gelu", "auto"),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    with FakeTensorMode(allow_non_fake_inputs=True):
        fa = torch.empty(2, 4, 48, dtype=FP8)
        out = OPS.scaled_mm_fp8_act_quant(fa, w, torch.ones(8), sw, None, torch.ones(1), "silu", "auto")
        assert out.shape == (2, 4, 32) and out.dtype == FP8
    assert torch.Tag.needs_fixed_stride_order in OPS.scaled_mm_fp8_act_quant.default.tags


def test_errors_name_the_problem():
    a, w, sa, sw, bias = _operands(8, 32, 48, 1)
    one = torch.ones(1)
    f = oasr_ops.scaled_mm_fp8_act_quant
    with pytest.raises(ValueError, match="activation must be one of"):
        f(a, w, sa, sw, one, "relu")
    with pytest.raises(ValueError, match="bias must have dtype torch.float32"):
        f(a, w, sa, sw, one, "gelu", bias=bias.half())
    with pytest.raises(ValueError, match="finite and > 0"):
        f(a, w, sa, sw, torch.zeros(1), "gelu")
    with pytest.raises(ValueError, match="finite and > 0"):
        f(a, w, sa, sw, torch.tensor([float("nan")]), "gelu")
    with pytest.raises(ValueError, match="out_scale must have shape"):
        f(a, w, sa, sw, torch.ones(32), "gelu")
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        f(a.view(torch.int8), w, sa, sw, one, "gelu")
    with pytest.raises(ValueError, match="N=24 is not a positive multiple of 16"):
        f(a, w[:24].contiguous(), sa, sw[:24].contiguous(), one, "gelu")
    with pytest.raises(ValueError, match="not contiguous"):
        f(torch.cat([a, a], 1)[:, ::2], w, sa, sw, one, "gelu")
    with pytest.raises(ValueError, match="config"):
        f(a, w, sa, sw, one, "gelu", config="not-a-config")


# ------------------------------------------------------------------------------------------------ kernels


def test_activation_variants_render_their_branch_and_leave_the_others_alone():
    from oasr_ops.families.scaled_mm.lanes import LANES as INT8_LANES

    int8_sm90 = next(ln for ln in INT8_LANES if ln.name == "sm90_int8_wgmma")
    for cid in ("t128x128x128_c2x1_pp", "t64x64x256_c1x1_pp_swab", "t128x256x128_c1x1_coop_fa"):
        cfg = parse(cid)
        plain = render(SM90, cfg, "fp8")
        assert "ActScale" not in plain and "tanh" not in plain and "Compute<oasr::DivRn, ElementD" in plain
        for act in ("gelu", "silu"):
            src = render(SM90, cfg, f"fp8_{act}")
            assert "Compute<oasr::ActScale, ElementD, float, kRN>, BiasedFma, OutScale>" in src
            assert "Compute<oasr::DivRn" not in src
            # the activation is the int8 epilogue's, from the same snippet (templates/_act_fast.cuh.j2)
            int8_src = render(int8_sm90, int8_sm90.default, f"int8_{act}")
            start = int8_src.index("CUTLASS_DEVICE float tanh_approx")
            snippet = int8_src[start:int8_src.index("}  // namespace oasr")]
            assert snippet in src and ("fminf(y * y" in snippet) == (act == "gelu")
            # nothing else changes: the same broadcasts as the plain quantizing kernel
            assert src.count("Sm90ColBroadcast") == plain.count("Sm90ColBroadcast")
    with pytest.raises(ValueError, match="not supported"):
        render(SM90, SM90.default, "bf16_gelu")
    with pytest.raises(ValueError, match="Stream-K"):
        render(SM90, parse("t128x128x128_c1x1_sk"), "fp8_gelu")


def test_sm89_has_no_activation_epilogue():
    with pytest.raises(ValueError, match="sm89_fp8_mma has no activation epilogue"):
        render(SM89, SM89.default, "fp8_silu")
    render(SM89, SM89.default, "fp8")  # the lane itself still renders (and compiles: test_scaled_mm_fp8.py)
    sel = act_quant.select_act_quant_config(2048, 512, 1000, "sm89")
    assert sel.config == "torch" and sel.signature == "scaled_mm_fp8|op=scaled_mm_fp8_quant|N=2048|K=512"


def test_an_sm89_config_is_refused_by_the_plan():
    # the CUDA path's plan (what a call with an sm89 config id builds on a GPU), built here without one
    with pytest.raises(ValueError, match="without an activation epilogue"):
        act_quant._make_plan(SM89.default.id, "gelu", 64, 256, 128)


def test_untuned_selection_is_a_tile_of_the_lane_not_torch():
    sel = act_quant.select_act_quant_config(2048, 512, 3984, "sm90")
    plain = oasr_ops.families.scaled_mm_fp8.ops.select_quant_config(2048, 512, 3984, "sm90")
    assert plain.config == "torch"  # the family's untuned policy for the quantizing op
    assert sel.config in SM90.ids() and sel.tier == "heuristic"
    assert sel.config == oasr_ops.families.scaled_mm_fp8.heuristic.heuristic_config(3984, 2048, 512, "sm90")
    assert parse(sel.config).kernel_schedule != "streamk"


def test_a_region_tables_torch_is_served_the_lanes_tile(monkeypatch):
    """A graph compiled with a symbolic M bakes the signature's region table, ``regions:*=torch`` where the DB has
    no entry (the family's untuned policy): the fused fc1's plan serves the tile `select_act_quant_config` serves
    for ``auto``, not torch._scaled_mm + the activation and the quantization in eager ops (found by
    tests/test_hot_path_coverage.py: every such call went to Python). An explicit ``torch`` keeps the torch arm."""
    built = []
    monkeypatch.setattr(act_quant.ops, "_kernel_run",
                        lambda op, cfg, *args, **kw: built.append((op, cfg.id, kw["variant"])) or (lambda *a: None))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    plan = act_quant._make_plan("regions:*=torch", "gelu", 3984, 2048, 512)
    tile = oasr_ops.families.scaled_mm_fp8.heuristic.heuristic_config(3984, 2048, 512, "sm90")
    assert (plan.config, plan.tier) == (tile, "heuristic") and tile in SM90.ids()
    assert built == [("scaled_mm_fp8_quant", tile, "fp8_gelu")]
    assert act_quant._make_plan("torch", "gelu", 3984, 2048, 512).config == "torch"
    assert len(built) == 1


def test_a_measured_quantizing_tile_is_served_and_baked(tuning_env):
    from torch.fx.experimental.proxy_tensor import make_fx

    from oasr_ops.families.graph import rewrite_graph
    from oasr_ops.tune import database

    sig = "scaled_mm_fp8|op=scaled_mm_fp8_quant|N=64|K=96"
    database.publish("scaled_mm_fp8", {sig: {"regions": [[None, "t64x128x128_c1x1_pp"]]}}, tier="user",
                     arch="sm90", lane="sm90_fp8_wgmma")
    oasr_ops.reload_tuning()
    assert act_quant.select_act_quant_config(64, 96, 40, "sm90").config == "t64x128x128_c1x1_pp"
    a, w, sa, sw, bias = _operands(40, 64, 96, 5)

    def f(a, w, sa, sw, bias, s):
        return OPS.scaled_mm_fp8_act_quant(a, w, sa, sw, bias, s, "gelu", "auto")

    gm = make_fx(f, tracing_mode="fake")(a, w, sa, sw, bias, torch.ones(1))
    res = rewrite_graph(gm.graph, bake=True, arch="sm90")
    node = next(n for n in gm.graph.nodes if n.target is OPS.scaled_mm_fp8_act_quant.default)
    assert node.args[6] == "gelu" and node.args[7] == "t64x128x128_c1x1_pp"
    assert any(s.op == "scaled_mm_fp8_quant" and s.family == "scaled_mm_fp8" for s in res.sites)


@pytest.mark.parametrize("arch", ["sm90", None])
def test_eager_torch_sites_are_baked_to_a_tile_where_the_policy_says_torch(tuning_env, monkeypatch, arch):
    """A compiled graph names its config: baking "torch" for an fp16 output or a quantizing site would bypass the
    runtime's rule (`ops._make_plan` keeps an explicit torch), so the bake applies it: the heuristic's tile. bf16
    output and an explicit "torch" keep the torch arm. arch None: the pass's arch comes from the environment
    (OASR_ARCH)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from oasr_ops.families.graph import rewrite_graph
    from oasr_ops.families.scaled_mm_fp8 import heuristic

    monkeypatch.setenv("OASR_ARCH", "sm90")
    a = torch.zeros(12000, 768, dtype=FP8)
    w = torch.zeros(768, 768, dtype=FP8)

    def f(a, w, sa, sw, os_):
        return (OPS.scaled_mm_fp8(a, w, sa, sw, None, torch.float16, "auto"),
                OPS.scaled_mm_fp8(a, w, sa, sw, None, torch.bfloat16, "auto"),
                OPS.scaled_mm_fp8(a, w, sa, sw, None, torch.float16, "torch"),
                OPS.scaled_mm_fp8_quant(a, w, sa, sw, None, os_, "auto"),
                OPS.scaled_mm_fp8_quant(a, w, sa, sw, None, os_, "torch"))

    gm = make_fx(f, tracing_mode="fake")(a, w, torch.ones(12000), torch.ones(768), torch.ones(1))
    res = rewrite_graph(gm.graph, bake=True, arch=arch)
    baked = [n.args[6] for n in gm.graph.nodes if n.target is OPS.scaled_mm_fp8.default]
    baked_quant = [n.args[6] for n in gm.graph.nodes if n.target is OPS.scaled_mm_fp8_quant.default]
    tile = heuristic.heuristic_config(12000, 768, 768, "sm90")
    assert tile in SM90.ids() and baked == [tile, "torch", "torch"]
    assert baked_quant == [tile, "torch"]  # the quantizing op's torch arm is eager passes too (session 39)
    assert [(s.config, s.tier) for s in res.sites][0] == (tile, "heuristic")
    assert [(s.op, s.config, s.tier) for s in res.sites][3] == ("scaled_mm_fp8_quant", tile, "heuristic")


@pytest.mark.parametrize("config", ["auto", "regions:*=torch", "regions:64=torch;*=heuristic"])
def test_the_plain_quantizing_op_is_served_a_tile_where_the_answer_is_torch(monkeypatch, config):
    """`scaled_mm_fp8_quant`'s torch arm is torch._scaled_mm with an fp32 output, the epilogue and the e4m3
    quantization in eager ops: 2.3-6.5x slower than the tiles at every shape measured (session 39, H100). Where
    ``auto`` (the family's untuned policy) or a region table answers torch, the plan runs the heuristic's tile;
    an explicit ``torch`` keeps the arm; the plain op with a bf16 output keeps the measured torch arm."""
    from oasr_ops.families.scaled_mm_fp8 import heuristic, ops

    built = []
    monkeypatch.setattr(ops, "_kernel_run",
                        lambda op, cfg, *args, **kw: built.append((op, cfg.id)) or (lambda *a: None))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    m, n, k = 40, 2048, 512
    tile = heuristic.heuristic_config(m, n, k, "sm90")
    assert ops.select_quant_config(n, k, m, "sm90").config == "torch"  # the policy: what the plan must not run
    plan = ops._make_plan("scaled_mm_fp8_quant", config, None, m, n, k)
    assert plan.config == tile and tile in SM90.ids() and built == [("scaled_mm_fp8_quant", tile)]
    assert ops._make_plan("scaled_mm_fp8_quant", "torch", None, m, n, k).config == "torch"
    assert ops._make_plan("scaled_mm_fp8", "regions:*=torch", torch.bfloat16, m, n, k).config == "torch"
    assert len(built) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_build_of_an_activation_kernel(monkeypatch, tmp_path):
    """One fp8_gelu kernel compiled for real (sm_90a, ~2 min of nvcc) and its C ABI checked on the CPU."""
    from oasr_ops.codegen.jit import JitSpec, build_many

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = JitSpec.for_kernel(SM90, parse("t128x128x128_c2x1_pp"), "fp8_gelu", "sm90")
    report = build_many([spec], jobs=1, progress=False)
    assert not report.failed, report.failed
    lib = ctypes.CDLL(str(spec.so_path))
    lib.oasr_describe.restype = ctypes.c_char_p
    assert lib.oasr_describe().decode().startswith("t128x128x128_c2x1_pp|fp8_gelu|sm90_fp8_wgmma|")
    assert lib.oasr_smm_abi_version() == 1
    for sym in ("oasr_smm_run", "oasr_smm_can_implement", "oasr_smm_workspace_size", "oasr_abi_version"):
        assert hasattr(lib, sym)


# ------------------------------------------------------------------------------------------------ calibration


class Block(nn.Module):
    """Pre-LN transformer FFN: LayerNorm -> fc1 -> GELU/SiLU -> fc2, residual."""

    def __init__(self, d=64, act=nn.GELU) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d), act(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


def test_calibration_round_trips_through_the_state_dict():
    model = Block().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8")
    scales = oasr_ops.calibrate(q, [x, x * 2])
    assert set(scales) == {"fc1", "fc2"}
    with torch.no_grad():
        assert scales["fc1"] == pytest.approx(float(q.ln(x * 2).abs().max()) / 448, rel=1e-3)
    assert q.fc2.input_scale.dtype == torch.float32 and q.fc2.input_scale.shape == (1,)
    fresh = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8")
    assert fresh.fc2.input_scale is None and "calibrated=False" in repr(fresh.fc2)
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh.fc2.input_scale, q.fc2.input_scale) and "calibrated=True" in repr(fresh.fc2)
    assert "scheme=fp8_w8a8" in repr(fresh.fc2)
    # an int8 model of the same weights: the same amax over 127 (fc1: its input does not depend on quantization)
    q8 = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    s8 = oasr_ops.calibrate(q8, [x, x * 2])
    assert s8["fc1"] * 127 == pytest.approx(scales["fc1"] * 448, rel=1e-6)


def test_plain_model_calibration_serves_both_schemes():
    from oasr_ops.families.scaled_mm.calibrate import calibrated_scale

    model = Block().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    s8 = oasr_ops.calibrate(model, [x])
    s_fp8 = oasr_ops.calibrate(model, [x], scheme="fp8_w8a8")
    assert s8["fc2"] * 127 == pytest.approx(s_fp8["fc2"] * 448, rel=1e-6)
    assert float(calibrated_scale(model.fc2.weight, 448.0)) == pytest.approx(s_fp8["fc2"], rel=1e-6)
    assert float(calibrated_scale(model.fc2.weight)) == pytest.approx(s8["fc2"], rel=1e-6)
    with pytest.raises(ValueError, match="scheme must be one of"):
        oasr_ops.calibrate(model, [x], scheme="fp4")


# ------------------------------------------------------------------------------------------------ the pass


def _compile(model, x, **options):
    options.setdefault("fuse_quantization", "act")
    return compile_captured(model, x, **options)


_calls = calls


def _before_next_gemm(node):
    """The nodes computed from `node`'s output without passing through another GEMM."""
    gemms = {OPS.scaled_mm_fp8.default, OPS.scaled_mm_fp8_act_quant.default, OPS.scaled_mm_fp8_residual.default}
    seen, todo = set(), [node]
    while todo:
        for u in todo.pop().users:
            if u not in seen:
                seen.add(u)
                if u.target not in gemms:
                    todo.append(u)
    return seen


def _assert_fused_fp8_ffn(graph, act, n_ffn=1):
    """fc1 is the fp8 quantizing GEMM with the activation, feeding fc2's scaled_mm_fp8 (or, with the residual add
    fused, scaled_mm_fp8_residual: the same first arguments) its e4m3 output directly (its only reader); no amax
    reads anything fc1 computed before the next GEMM (the only activation quantizations left are the LayerNorms',
    for Inductor to fuse)."""
    aqs = _calls(graph, OPS.scaled_mm_fp8_act_quant)
    assert len(aqs) == n_ffn and all(aq.args[6] == act for aq in aqs)
    fc2s = _calls(graph, OPS.scaled_mm_fp8) + _calls(graph, OPS.scaled_mm_fp8_residual)
    for aq in aqs:
        fc2 = [n for n in fc2s if aq in n.all_input_nodes]
        assert len(fc2) == 1 and fc2[0].args[0] is aq  # fc2 reads fc1's e4m3 output
        assert list(aq.users) == fc2  # ... and nothing else does
        assert fc2[0].args[2] is aq.args[5]  # ... with scale_a = the out_scale fc1 quantized with
        for n in _before_next_gemm(aq):
            assert n.target not in (torch.ops.aten.amax.default, torch.ops.aten.max.dim), \
                f"{n} re-reads fc1's output to quantize it"
    assert not _calls(graph, OPS.scaled_mm_act_quant) and not _calls(graph, OPS.scaled_mm_fp8_quant)
    assert all(n.args[5] == "fp8" for n in _calls(graph, OPS.layer_norm_quant))


@pytest.mark.parametrize("act,name", [(nn.GELU, "gelu"), (nn.SiLU, "silu")])
def test_options_quantization_fp8_fuses_fc1_activation(fresh_inductor, act, name):
    torch.manual_seed(0)
    model = Block(act=act).to(torch.float16).eval()
    x = torch.randn(2, 33, 64, dtype=torch.float16)
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(x.float())
    oasr_ops.calibrate(model, [torch.randn(2, 33, 64, dtype=torch.float16) for _ in range(4)] + [x])
    out, graph = _compile(model, x, quantization="fp8_w8a8")
    _assert_fused_fp8_ffn(graph, name)
    rep = fuse_quant.fuse_log()[-1]
    assert (rep.layer_norm_quant, rep.act_quant, rep.unfused) == (0, 1, [])
    # the LayerNorm's quantization is still in the graph, decomposed for Inductor to fuse with the LayerNorm
    assert any(n.op == "call_function" and n.target is torch.ops.aten.amax.default for n in graph.nodes)
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < 5e-2, err


def test_quantize_then_calibrate_fuses_the_same_way_and_matches_the_ops(fresh_inductor):
    torch.manual_seed(1)
    model = Block().to(torch.bfloat16).eval()
    x = torch.randn(3, 17, 64, dtype=torch.bfloat16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8")
    oasr_ops.calibrate(q, [x])
    out, graph = _compile(q, x)
    _assert_fused_fp8_ffn(graph, "gelu")
    # the fused graph computes what its ops compute when called one by one, up to the LayerNorm's quantization,
    # which Inductor computes from its fp32 LayerNorm (eager rounds the LayerNorm to bf16 first): an e4m3 step
    # here and there, far below the quantization error itself
    with torch.no_grad():
        a, sa = oasr_ops.quantize_fp8(q.ln(x).reshape(-1, 64))
        h = oasr_ops.scaled_mm_fp8_act_quant(a, q.fc1.weight_q, sa, q.fc1.scale_w, q.fc2.input_scale, "gelu",
                                             bias=q.fc1.bias.float())
        y = oasr_ops.scaled_mm_fp8(h, q.fc2.weight_q, q.fc2.input_scale, q.fc2.scale_w, q.fc2.bias, torch.bfloat16)
        want = x + y.reshape(x.shape)
        ref = copy.deepcopy(model).float()(x.float())
    assert ((out.float() - want.float()).abs().max() / want.float().abs().max()).item() < 1e-2
    assert ((out.float() - want.float()).abs().max() < (want.float() - ref).abs().max())


def test_fuse_quantization_true_with_fp8_serves_the_layer_norm_with_its_fp8_scheme(fresh_inductor):
    model = Block(act=nn.SiLU).half().eval()
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    q = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8")
    oasr_ops.calibrate(q, [x])
    out, graph = _compile(q, x, fuse_quantization=True)
    _assert_fused_fp8_ffn(graph, "silu")
    lnq, = _calls(graph, OPS.layer_norm_quant)
    assert lnq.args[5] == "fp8"
    fc1, = [n for n in _calls(graph, OPS.scaled_mm_fp8_act_quant)]
    assert lnq in _ancestors(fc1)  # fc1 reads the LayerNorm's e4m3 row and its per-token scale
    assert not [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.amax.default]
    rep = fuse_quant.fuse_log()[-1]
    assert (rep.layer_norm_quant, rep.act_quant, rep.unfused) == (1, 1, [])
    # the graph computes what its ops compute one by one: the fp8 LayerNorm quantization is exactly
    # quantize_per_token_fp8 of the LayerNorm rounded to fp16
    with torch.no_grad():
        a, sa, _ = oasr_ops.layer_norm_quant(x.contiguous(), q.ln.weight, q.ln.bias, q.ln.eps, scheme="fp8")
        a2, sa2 = oasr_ops.quantize_fp8(q.ln(x))
        assert torch.equal(a.view(torch.uint8), a2.view(torch.uint8)) and torch.equal(sa, sa2)
        h = oasr_ops.scaled_mm_fp8_act_quant(a.reshape(-1, 64), q.fc1.weight_q, sa, q.fc1.scale_w, q.fc2.input_scale,
                                             "silu", bias=q.fc1.bias.float())
        # fc2 + the block's residual add: one oasr.scaled_mm_fp8_residual (fuse_residual follows the fusion)
        y = oasr_ops.scaled_mm_fp8_residual(h, q.fc2.weight_q, q.fc2.input_scale, q.fc2.scale_w,
                                            x.reshape(-1, 64), 1.0, q.fc2.bias, torch.float16)
        want = y.reshape(x.shape)
    assert len(_calls(graph, OPS.scaled_mm_fp8_residual)) == 1
    assert torch.equal(out, want)


def test_without_calibration_fc2_stays_dynamic(fresh_inductor):
    q = oasr_ops.quantize_(Block().half().eval(), "fp8_w8a8")
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    out, graph = _compile(q, x)
    assert not _calls(graph, OPS.scaled_mm_fp8_act_quant) and len(_calls(graph, OPS.scaled_mm_fp8)) == 1
    assert len(_calls(graph, OPS.scaled_mm_fp8_residual)) == 1  # fc2 + the residual add
    rep = fuse_quant.fuse_log()[-1]
    assert rep.act_quant == 0 and len(rep.unfused) == 1 and "gelu" in rep.unfused[0]
    with torch.no_grad():  # dynamic per token both ways: the same ops, up to Inductor's fp32 LayerNorm
        want = q(x)
    assert ((out.float() - want.float()).abs().max() / want.float().abs().max()).item() < 2e-2


def test_fusion_off_and_fusable_layers(fresh_inductor):
    class WithProj(Block):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 64)

        def forward(self, x):
            y = super().forward(x)
            return y + self.proj(torch.tanh(y))

    model = WithProj().half().eval()
    x = torch.randn(2, 5, 64, dtype=torch.float16)
    oasr_ops.calibrate(model, [x])
    _out, graph = _compile(model, x, quantization=oasr_ops.Fp8W8A8Config(layers="all"), fuse_quantization=False)
    assert not _calls(graph, OPS.scaled_mm_fp8_act_quant) and len(_calls(graph, OPS.scaled_mm_fp8)) == 3
    torch.compiler.reset()
    _out, graph = _compile(model, x, quantization="fp8_w8a8")  # the defaults: layers="fusable", fusion on
    # fc2 (with the block's residual add); proj stays fp16 (an aten mm)
    assert not _calls(graph, OPS.scaled_mm_fp8) and len(_calls(graph, OPS.scaled_mm_fp8_residual)) == 1
    assert len(_calls(graph, OPS.scaled_mm_fp8_act_quant)) == 1
    with pytest.raises(ValueError, match="layers must be"):
        oasr_ops.Fp8W8A8Config(layers="some")


def test_example_conformer_fp8_ffns_are_fused(fresh_inductor):
    """The example Conformer (macaron: two LayerNorm -> Linear -> SiLU -> Linear FFNs per block), quantize_ fp8 on
    the fusable layers + calibrate: every FFN's fc1 becomes the fp8 act-quant GEMM feeding fc2."""
    from examples import conformer

    torch.manual_seed(0)
    model = conformer.build_model("S", dtype=torch.float16, num_layers=2).eval()
    x, = conformer.example_inputs(batch=2, frames=64, dtype=torch.float16, seed=1)
    flt = oasr_ops.fusable_filter(model, x)
    torch.compiler.reset()
    q = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8", filter_fn=flt)
    oasr_ops.calibrate(q, [conformer.example_inputs(batch=2, frames=64, dtype=torch.float16, seed=s)[0]
                           for s in (2, 3)])
    out, graph = _compile(q, x)
    n_ffn = 2 * 2
    _assert_fused_fp8_ffn(graph, "silu", n_ffn)
    rep = fuse_quant.fuse_log()[-1]
    assert rep.act_quant == n_ffn and rep.unfused == []
    with torch.no_grad():
        ref = conformer.build_model("S", dtype=torch.float32, num_layers=2).eval()(x.float())
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < 0.1, err
