"""fp8 e4m3 W8A8 family (`scaled_mm_fp8`) on the CPU: op schemas, fakes and opcheck, the reference against a
float64 formula, the quantizers, error paths, selection rules (tiers, the half-wave heuristic, Stream-K only from
measured entries, never for the quantizing op, another lane's config skipped), candidates and gates, rendering
of every config, `quantize_` / the in-graph quantization, and real nvcc builds of each kernel kind (slow)."""
from __future__ import annotations

import ctypes
import json
import shutil
import sys
import warnings

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops import paths
from oasr_ops.codegen.emit_fp8 import OUT_DTYPES
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse
from oasr_ops.runtime.registry import get, get_lane
from oasr_ops.tune import database as db

fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
from oasr_ops.families.scaled_mm_fp8 import candidates as fcand  # noqa: E402
from oasr_ops.families.scaled_mm_fp8 import heuristic as fheur  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.lanes import summation_order  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.reference import FP8, quantize_weight_fp8  # noqa: E402

SM90 = get_lane("sm90_fp8_wgmma")
SM89 = get_lane("sm89_fp8_mma")
SK = "t128x128x128_c1x1_sk"
BIG = "t128x256x128_c1x1_coop"
FA = "t128x128x128_c2x1_pp_fa"
SIG = "scaled_mm_fp8|op=scaled_mm_fp8|N=768|K=256"
QSIG = "scaled_mm_fp8|op=scaled_mm_fp8_quant|N=768|K=256"


def _inputs(m, n, k, *, per_token=True, per_channel=True, seed=0, lead=None):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 4).to(FP8)
    w = (torch.randn(n, k, generator=g) * 4).to(FP8)
    sa = (torch.rand(m if per_token else 1, generator=g) * 1e-2 + 1e-3).float()
    sw = (torch.rand(n if per_channel else 1, generator=g) * 1e-2 + 1e-3).float()
    if lead is not None:
        a = a.reshape(*lead, k)
    return a, w, sa, sw


def _formula64(a, w, sa, sw, bias):
    """The formula with an independent exact accumulator: products of e4m3 values summed as python fractions
    would be exact; float64 sums are exact here (|products| >= 2**-18, K small), checked against int math below."""
    a2 = a.reshape(-1, a.shape[-1]).double()
    acc = (a2 @ w.double().t()).float()
    y = sa.reshape(-1, 1) * (sw.reshape(1, -1) * acc)
    return y if bias is None else y + bias.float()


# ------------------------------------------------------------------------------------------------ ops


def test_family_registered_and_lanes():
    spec = get("scaled_mm_fp8")
    assert spec.ops == ("scaled_mm_fp8", "scaled_mm_fp8_quant") and not spec.dtyped and spec.policy == "torch"
    assert {lane.name for lane in spec.lanes} == {"sm90_fp8_wgmma", "sm89_fp8_mma"}
    assert spec.native_lane("sm90") is SM90 and spec.native_lane("sm89") is SM89
    assert spec.native_lane("sm80") is None  # no fp8 tensor cores: torch answers
    cs = SM90.space
    assert len(cs) >= 8
    kinds = {c.kernel_schedule for c in cs}
    assert kinds == {"pingpong", "cooperative", "streamk"}
    assert any(c.swap_ab for c in cs) and any(c.fast_accum for c in cs) and any(not c.fast_accum for c in cs)
    assert any(c.swap_ab and c.tile[1] == 16 for c in cs)  # the small-M swap-AB tile (vLLM's 64x16x256)
    assert all(c.generation == "2x" for c in SM89.space)


def test_summation_order_groups():
    groups = {}
    for c in SM90.space:
        groups.setdefault(summation_order(c), []).append(c.id)
    # the non-FastAccum data-parallel K=128 tiles form one group, the FastAccum ones another
    assert set(groups["promote128"]) == {"t64x64x128_c1x1_pp", "t64x128x128_c1x1_pp", "t128x128x128_c1x1_coop",
                                         "t128x128x128_c2x1_pp", BIG}
    assert set(groups["fast"]) == {"t64x128x128_c1x1_pp_fa", FA, "t128x256x128_c1x1_coop_fa",
                                   "t128x128x128_c1x2_pp_fa", "t128x128x128_c2x1_pp_z8_fa",
                                   "t128x256x128_c1x1_coop_z8_fa"}  # a swizzle orders tiles, not sums
    assert set(groups["promote256|swab"]) == {"t64x16x256_c1x1_pp_swab", "t64x64x256_c1x1_pp_swab"}
    assert all(len(v) == 1 for k, v in groups.items() if "streamk" in k)  # each Stream-K tile its own order


def test_candidates_are_not_served_and_join_the_order_groups():
    from oasr_ops.families.scaled_mm_fp8.lanes import SM90_CANDIDATES, sm90_with_candidates

    assert not set(SM90_CANDIDATES) & set(SM90.space)
    lane = sm90_with_candidates()
    assert lane.name == SM90.name and lane.space[:len(SM90.space)] == SM90.space
    assert set(lane.space) == set(SM90.space) | set(SM90_CANDIDATES)
    for c in SM90_CANDIDATES:
        assert lane.infeasible_reason(c, n=768, k=3072, arch_family="sm90") is None, c.id
    assert get("scaled_mm_fp8").wave_guard_dtype == "fp8"


def test_swizzled_tiles_render_their_swizzle():
    from oasr_ops.families.scaled_mm_fp8.lanes import SM90_CANDIDATES, sm90_with_candidates

    lane = sm90_with_candidates()
    swizzled = [c for c in lane.space if c.swizzle != 1]
    assert swizzled  # the 8192^3 tiles of the lane
    for c in lane.space:
        src = render(lane, c, "bf16")
        assert (f"args.scheduler.max_swizzle_size = {c.swizzle};" in src) == (c.swizzle != 1), c.id
        # swizzling orders the tiles, never a tile's sums: a swizzled tile is in its unswizzled twin's group
        if c.swizzle != 1:
            twin = parse(c.id.replace(f"_z{c.swizzle}", ""))
            assert summation_order(c) == summation_order(twin)
    for c in SM90_CANDIDATES:
        with pytest.raises(ValueError, match="not in lane"):
            render(SM90, c, "bf16")


@pytest.mark.parametrize("per_token,per_channel", [(True, True), (False, False), (True, False), (False, True)])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_reference_is_the_formula(per_token, per_channel, out_dtype, with_bias):
    for m in (1, 7, 17, 127):
        a, w, sa, sw = _inputs(m, 48, 96, per_token=per_token, per_channel=per_channel, seed=m)
        bias = torch.randn(48).to(out_dtype) if with_bias else None
        out = torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, bias, out_dtype, "auto")
        assert out.dtype == out_dtype and out.shape == (m, 48)
        assert torch.equal(out, _formula64(a, w, sa, sw, bias).to(out_dtype))
        # and close to the real-valued product of the dequantized operands
        full = (a.double() * sa.double().reshape(-1, 1)) @ (w.double() * sw.double().reshape(-1, 1)).t()
        if bias is not None:
            full = full + bias.double()
        eps = torch.finfo(out_dtype).eps
        assert (out.double() - full).abs().max() <= 2 * eps * full.abs().max() + 1e-6


def test_float64_accumulator_is_exact():
    # every e4m3 value is k * 2**e with |k| < 16; sum the products as integers at a common scale
    a, w, _, _ = _inputs(5, 16, 4096, seed=3)
    fa, fw = a.double(), w.double()
    s = 2.0 ** 9  # smallest e4m3 subnormal is 2**-9
    ia, iw = (fa * s).round().long(), (fw * s).round().long()
    assert torch.equal(ia.double() / s, fa) and torch.equal(iw.double() / s, fw)
    exact = (ia @ iw.t()).double() / s ** 2
    assert torch.equal(fa @ fw.t(), exact)


def test_leading_dims_and_config_args():
    a, w, sa, sw = _inputs(6, 32, 64, lead=(2, 3))
    out = oasr_ops.scaled_mm_fp8(a, w, sa, sw, None, torch.float16)
    assert out.shape == (2, 3, 32)
    for cfg in ("auto", "heuristic", "torch", "default", FA, "t64x16x256_c1x1_pp_fa_swab"):
        assert torch.equal(torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, None, torch.float16, cfg), out)
    with pytest.raises(ValueError, match="config"):
        torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, None, torch.float16, "t64x64x128_c1x1_pp_fast")


def test_quant_op_reference_and_saturation():
    a, w, sa, sw = _inputs(9, 32, 64)
    bias = torch.randn(32)
    out_scale = torch.tensor([0.01])
    q = torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, bias, out_scale, "auto")
    assert q.dtype == FP8 and q.shape == (9, 32)
    y = _formula64(a, w, sa, sw, bias) / out_scale
    assert torch.equal(q.view(torch.uint8), y.clamp(-448, 448).to(FP8).view(torch.uint8))
    # a tiny out_scale saturates to +-448, never NaN
    q = torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, None, torch.tensor([1e-9]), "auto")
    assert set(q.float().abs().unique().tolist()) <= {0.0, 448.0}
    per_row = torch.rand(9) + 0.5
    q = torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, None, per_row, "auto")
    want = (_formula64(a, w, sa, sw, None) / per_row[:, None]).clamp(-448, 448).to(FP8)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))


def test_quantizers():
    x = torch.randn(7, 64) * torch.logspace(-3, 3, 7)[:, None]
    q, s = torch.ops.oasr.quantize_per_token_fp8(x)
    assert q.dtype == FP8 and s.shape == (7,) and s.dtype == torch.float32
    assert torch.allclose(q.float().abs().amax(1), torch.full((7,), 448.0))
    rel = ((q.float() * s[:, None] - x).abs() / x.abs().amax(1, keepdim=True)).max()
    assert rel <= 2 ** -4  # e4m3 keeps 3 mantissa bits: half an ulp of the row max
    wq, sw = quantize_weight_fp8(torch.randn(16, 32))
    assert wq.dtype == FP8 and sw.shape == (16,)
    z, zs = torch.ops.oasr.quantize_per_token_fp8(torch.zeros(2, 16))
    assert torch.all(z.float() == 0) and torch.all(zs > 0)


# opcheck's test_schema compares inputs before and after with arithmetic that has no fp8 CPU kernel
# ("mul_cpu_reduced_float" not implemented for Float8_e4m3fn): the other utilities run, and the schema's promise
# (no input mutated, the output aliases no input) is checked by hand on the bytes.
_FP8_OPCHECK = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def _no_mutation_no_alias(op, args):
    before = [t.clone() for t in args if isinstance(t, torch.Tensor)]
    out = op(*args)
    after = [t for t in args if isinstance(t, torch.Tensor)]
    for b, t in zip(before, after):
        assert torch.equal(b.view(torch.uint8) if b.element_size() == 1 else b,
                           t.view(torch.uint8) if t.element_size() == 1 else t)
        assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_opcheck():
    a, w, sa, sw = _inputs(19, 32, 64)
    bias = torch.randn(32).bfloat16()
    cases = [(torch.ops.oasr.scaled_mm_fp8.default, (a, w, sa, sw, bias, torch.bfloat16, "auto")),
             (torch.ops.oasr.scaled_mm_fp8.default, (a, w, sa[:1], sw[:1], None, torch.float16, "torch")),
             (torch.ops.oasr.scaled_mm_fp8_quant.default, (a, w, sa, sw, bias.float(), torch.tensor([0.5]), "auto"))]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=_FP8_OPCHECK)
        _no_mutation_no_alias(op, args)
    torch.library.opcheck(torch.ops.oasr.quantize_per_token_fp8.default, (torch.randn(7, 64),),
                          test_utils=_FP8_OPCHECK)


def test_fake_and_compile():
    a, w, sa, sw = _inputs(8, 32, 64)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fw, fsa, fsw = (mode.from_tensor(t) for t in (a, w, sa, sw))
        out = torch.ops.oasr.scaled_mm_fp8(fa, fw, fsa, fsw, None, torch.bfloat16, "auto")
        assert out.shape == (8, 32) and out.dtype == torch.bfloat16
        q = torch.ops.oasr.scaled_mm_fp8_quant(fa, fw, fsa, fsw, None, mode.from_tensor(torch.ones(1)), "auto")
        assert q.dtype == FP8
        with pytest.raises(ValueError, match="multiple of 16"):
            torch.ops.oasr.scaled_mm_fp8(mode.from_tensor(torch.zeros(8, 24).to(FP8)),
                                         mode.from_tensor(torch.zeros(32, 24).to(FP8)), fsa, fsw, None,
                                         torch.float16, "auto")

    def f(x, wq, sw_):
        q, s = torch.ops.oasr.quantize_per_token_fp8(x)
        return torch.ops.oasr.scaled_mm_fp8(q, wq, s, sw_, None, torch.bfloat16, "auto")

    x = torch.randn(8, 64)
    eager = f(x, w, sw)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, sw)
    assert torch.equal(eager, compiled)


def _bad(**kw):
    a, w, sa, sw = _inputs(4, 32, 64)
    args = dict(a=a, w=w, sa=sa, sw=sw, bias=None, out_dtype=torch.float16, config="auto")
    args.update(kw)
    return args


@pytest.mark.parametrize("case,match", [
    (dict(a=torch.zeros(4, 64, dtype=torch.int8)), "float8_e4m3fn"),
    (dict(w=torch.zeros(32, 64, dtype=torch.float16)), "float8_e4m3fn"),
    (dict(a=torch.zeros(4, 64).to(torch.float8_e5m2)), "float8_e4m3fn"),
    (dict(a=torch.zeros(4, 24).to(FP8), w=torch.zeros(32, 24).to(FP8)), "K=24 is not a positive multiple of 16"),
    (dict(w=torch.zeros(24, 64).to(FP8), sw=torch.ones(24)), "N=24 is not a positive multiple of 16"),
    (dict(w=torch.zeros(32, 48).to(FP8)), "K mismatch"),
    (dict(w=torch.zeros(2, 32, 64).to(FP8)), "2-D"),
    (dict(sa=torch.ones(3)), r"scale_a must have shape \[1\] \(per tensor\) or \[M=4\]"),
    (dict(sa=torch.ones(4, dtype=torch.float16)), "scale_a must be float32"),
    (dict(sw=torch.ones(31)), r"scale_w must have shape \[1\] \(per tensor\) or \[N=32\]"),
    (dict(sw=torch.ones(1, 32)), "scale_w must have shape"),
    (dict(bias=torch.zeros(32, dtype=torch.bfloat16)), "bias must have dtype torch.float16"),
    (dict(bias=torch.zeros(16, dtype=torch.float16)), r"bias must have shape \(32,\)"),
    (dict(out_dtype=torch.float32), "out_dtype must be torch.float16 or torch.bfloat16"),
    (dict(config="b64x64x64_bogus"), "config"),
])
def test_errors(case, match):
    args = _bad(**case)
    with pytest.raises(ValueError, match=match):
        torch.ops.oasr.scaled_mm_fp8(args["a"], args["w"], args["sa"], args["sw"], args["bias"], args["out_dtype"],
                                     args["config"])


def test_quant_errors():
    a, w, sa, sw = _inputs(4, 32, 64)
    for bad, match in ((torch.tensor([0.0]), "finite and > 0"), (torch.tensor([float("nan")]), "finite and > 0"),
                       (torch.ones(32), r"out_scale must have shape \[1\]"), (torch.ones(1).double(), "float32")):
        with pytest.raises(ValueError, match=match):
            torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, None, bad, "auto")
    with pytest.raises(ValueError, match="bias must have dtype torch.float32"):
        torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, torch.zeros(32).half(), torch.ones(1), "auto")
    with pytest.raises(ValueError, match="not contiguous"):
        torch.ops.oasr.scaled_mm_fp8(torch.zeros(64, 4).to(FP8).t(), w, sa, sw, None, torch.float16, "auto")


# ------------------------------------------------------------------------------------------------ selection


@pytest.fixture
def tiers(tmp_path, monkeypatch):
    user, system = tmp_path / "user", tmp_path / "system"
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(user))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    monkeypatch.delenv("OASR_GEMM_COMPILE_SET", raising=False)
    monkeypatch.setattr(paths, "system_db_dir", lambda: system)
    db.reload()
    fops.reset_selection()
    yield
    monkeypatch.undo()
    db.reload()
    fops.reset_selection()


def _publish(tier, entries):
    db.publish("scaled_mm_fp8", entries, tier=tier, arch="sm90")
    db.reload()


def _write_raw(root, entries):
    from oasr_ops.runtime import validators as val

    doc = {"schema": 2, "kernel_family": "scaled_mm_fp8", "arch_family": "sm90", "lane": SM90.name,
           "validators": val.current_soft_validators(SM90.name), "configs": {}, "entries": entries}
    p = root / "sm90" / "scaled_mm_fp8.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    db.reload()


def test_torch_when_untuned(tiers):
    # the untuned policy is torch._scaled_mm (the half-wave heuristic measured 0.79x of it on the H200)
    s = fops.select_config(768, 256, 100)
    assert s.tier == "default" and s.config == "torch" and s.signature == SIG
    assert fops.resolution_counts() == {"scaled_mm_fp8": {"default": 1}}
    assert fops.heuristic_config(100, 768, 256, "sm90") in SM90.ids()  # still an arm / explicit config


def test_tiers_regions_and_measured_heuristic(tiers):
    _publish("system", {SIG: {"regions": [[64, "t64x16x256_c1x1_pp_swab"], [1024, "heuristic"], [None, BIG]]}})
    _publish("user", {SIG: {"regions": [[16, SK]]}})
    assert fops.select_config(768, 256, 8) == fops.Selection(SK, "user", SIG)  # measured: Stream-K allowed
    assert fops.select_config(768, 256, 17) == fops.Selection("t64x16x256_c1x1_pp_swab", "system", SIG)
    s = fops.select_config(768, 256, 500)
    assert s.tier == "system" and s.config == fops.heuristic_config(500, 768, 256, "sm90")
    assert fops.select_config(768, 256, 100000) == fops.Selection(BIG, "system", SIG)


def test_torch_is_an_answer(tiers):
    _publish("system", {SIG: {"regions": [[None, "torch"]]}})
    assert fops.select_config(768, 256, 4096) == fops.Selection("torch", "system", SIG)


def test_quant_never_serves_stream_k(tiers):
    _write_raw(paths.system_db_dir(), {QSIG: {"regions": [[64, SK], [None, BIG]]}, SIG: {"regions": [[64, SK]]}})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s1 = fops.select_quant_config(768, 256, 32)
    assert (s1.tier, s1.config) == ("default", "torch")  # the skipped Stream-K tile falls to the policy
    assert any("Stream-K" in str(w.message) for w in rec)
    assert fops.select_quant_config(768, 256, 1000) == fops.Selection(BIG, "system", QSIG)
    assert fops.select_config(768, 256, 32) == fops.Selection(SK, "system", SIG)


def test_other_lanes_config_is_skipped(tiers):
    # an sm89 (2.x) config in an sm90 file: warned once, skipped, the untuned policy answers
    _write_raw(paths.system_db_dir(), {SIG: {"regions": [[None, "b128x128x64_w64x64x64_s3"]]}})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = fops.select_config(768, 256, 4096)
        fops.select_config(768, 256, 8192)
    assert (s.tier, s.config) == ("default", "torch")
    msgs = [str(w.message) for w in rec if "b128x128x64_w64x64x64_s3" in str(w.message)]
    assert len(msgs) == 1, msgs


def test_outside_production_set_is_skipped(tiers, monkeypatch):
    from oasr_ops.runtime import production

    monkeypatch.setattr(production, "family_production_configs", lambda family, arch: [SM90.default])
    _publish("system", {SIG: {"regions": [[None, FA]]}})
    with pytest.warns(UserWarning, match="outside this process's production set"):
        s = fops.select_config(768, 256, 4096)
    assert (s.tier, s.config) == ("default", "torch")


def test_production_set_has_heuristic_tiles_and_db_refs(tiers):
    _publish("system", {SIG: {"regions": [[64, FA]]}})
    ids = {c.id for c in fops.production_configs("sm90")}
    assert FA in ids and set(fheur.heuristic_ids(SM90)) <= ids and SM90.default.id in ids


def test_half_wave_heuristic(monkeypatch):
    sms = 132
    for m in (1, 7, 16, 17, 64, 65, 127, 1000, 4096, 16384):
        for n, k in ((256, 256), (768, 1024), (1024, 1025), (1024, 4096), (4096, 1024), (5120, 5120),
                     (256, 16384)):
            cid = fheur.heuristic(SM90, m, n, k, "sm90")
            c = SM90.get(cid)
            assert c.kernel_schedule != "streamk"
            # FastAccum exactly up to K = 1024 (where every FastAccum tile passed the build's gate on the H200)
            assert c.fast_accum == (k <= fheur.FAST_ACCUM_MAX_K == 1024)
            if m <= 64:
                assert c.tile[0] == 64 and (c.swap_ab or c.tile[1] == 128)
            if not c.fast_accum:
                # never a tile whose full-fp32 accumulators spill (two 128-register accumulators per warpgroup:
                # 430 / 354 TFLOP/s at 8192^3 on the H200, against 958 for 128x128 cooperative)
                assert cid not in ("t128x256x128_c1x1_coop", "t128x128x128_c2x1_pp")
            # the rule: the first (largest) candidate launching half a wave, else the one with the most CTAs
            name = ("small" if m <= 64 else "large") + ("_fast" if k <= 1024 else "")
            table = fheur._CANDIDATES[SM90.name][name]
            wave = [t for t in table if fheur.ctas(t, m, n) >= sms / 2]
            assert cid == (wave[0] if wave else table[-1])
    assert fheur.heuristic(SM90, 8192, 8192, 8192, "sm90") == "t128x128x128_c1x1_coop"
    assert fheur.heuristic(SM90, 12000, 3072, 768, "sm90") == "t128x128x128_c2x1_pp_fa"  # Whisper small's fc1
    assert fheur.heuristic(SM90, 12000, 768, 3072, "sm90") == "t128x128x128_c1x1_coop"  # its fc2: K > 1024
    assert fheur.heuristic(SM90, 100, 256, 256, "sm90") == "t64x64x256_c1x1_pp_fa_swab"  # no tile fills half a wave: the most CTAs (8)
    assert fheur.heuristic(SM90, 16, 1024, 256, "sm90") == "t64x16x256_c1x1_pp_fa_swab"
    assert fheur.heuristic(SM90, 16, 1024, 2048, "sm90") == "t64x16x256_c1x1_pp_swab"
    assert fheur.ctas("t64x16x256_c1x1_pp_swab", 16, 1024) == 16  # swapped: 64 rows over N, 16 cols over M
    for m in (1, 100, 5000):
        assert SM89.get(fheur.heuristic(SM89, m, 1024, 1024, "sm89")).generation == "2x"
    assert fheur.heuristic_config(100, 1024, 1024, "sm80") == "torch"
    # OASR_FP8_HEURISTIC_FAST_ACCUM=off: full accumulation at every K (the rule before session 36)
    monkeypatch.setenv("OASR_FP8_HEURISTIC_FAST_ACCUM", "off")
    assert fheur.heuristic(SM90, 12000, 3072, 768, "sm90") == "t128x128x128_c1x1_coop"
    assert fheur.heuristic(SM90, 16, 1024, 256, "sm90") == "t64x16x256_c1x1_pp_swab"
    monkeypatch.setenv("OASR_FP8_HEURISTIC_FAST_ACCUM", "of")  # a misspelling warns once and keeps the default
    with pytest.warns(RuntimeWarning, match="OASR_FP8_HEURISTIC_FAST_ACCUM"):
        assert fheur.heuristic(SM90, 12000, 3072, 768, "sm90") == "t128x128x128_c2x1_pp_fa"
    # every tile it can answer is a production kernel (built ahead of time)
    assert set(fheur.heuristic_ids(SM90)) >= {"t128x128x128_c2x1_pp_fa", "t128x128x128_c1x1_coop"}


@pytest.mark.parametrize("var,value", [("OASR_FP8_HEURISTIC_FAST_ACCUM", "off"), ("OASR_GEMM_HEURISTIC", "0"),
                                       ("OASR_TUNE_MODEL_FALLBACK", "0"), ("OASR_GEMM_COMPILE_SET", "all")])
def test_selection_settings_enter_the_graph_cache_key(monkeypatch, var, value):
    # the graph pass bakes tiles: a graph compiled under one setting must not be reused from Inductor's FX graph
    # cache under another (session 36: an A/B in two processes ran the first one's baked tiles twice)
    from oasr_ops.inductor.rewrite import OasrRewritePass

    monkeypatch.delenv(var, raising=False)
    before = OasrRewritePass(arch="sm90").uuid()
    monkeypatch.setenv(var, value)
    assert OasrRewritePass(arch="sm90").uuid() != before


def test_variants_for():
    full = fops.variants_for(768, 256, False, "sm90")
    assert set(full) == set(SM90.ids())
    quant = fops.variants_for(768, 256, True, "sm90")
    assert SK not in quant and len(quant) == len(full) - 2
    assert fops.variants_for(760, 256, False, "sm90") == [] and fops.variants_for(768, 200, False, "sm90") == []
    assert fops.variants_for(768, 256, False, "sm80") == []


def test_candidates_and_gates():
    from oasr_ops.runtime.db_signatures import parse_signature

    cands = fcand.candidates(parse_signature(SIG), "sm90")
    ids = [c.id for c in cands]
    assert ids[0] == "torch" and ids[-1] == "heuristic" and cands[0].fallback and not cands[-1].fallback
    assert set(ids[1:-1]) == set(SM90.ids())
    by = {c.id: c for c in cands}
    seen_rep = {}
    for cid in ids[1:-1]:
        g = by[cid].gate
        order = summation_order(parse(cid))
        if g.kind == "tolerance":
            assert g.baseline == "torch" and g.factor == 4.0 and order not in seen_rep
            seen_rep[order] = cid
        else:  # bitwise against its group's representative, which is listed (and gated) before it
            assert g.baseline == seen_rep[order]
    assert by["torch"].gate.kind == "tolerance" and by["heuristic"].gate.kind == "tolerance"
    q = fcand.candidates(parse_signature(QSIG), "sm90")
    assert SK not in {c.id for c in q}


def test_census_from_gemm():
    from oasr_ops.runtime.db_signatures import parse_signature

    assert fcand.census_from(parse_signature("gemm|op=gemm|dt=half|N=768|K=256"), 1000) == (SIG, 500)
    assert fcand.census_from(parse_signature("gemm|op=gemm|dt=half|N=760|K=256"), 1000) is None


def test_fp8_gate_helpers():
    from oasr_ops.tune.candidates import same_bits
    from oasr_ops.tune.stats import numeric_gate

    x = torch.randn(4, 16).to(FP8)
    assert same_bits(x, x.clone()) and not same_bits(x, (x.float() * 2).to(FP8))
    ok, why = numeric_gate(x, x.double(), x)
    assert ok, why


# ------------------------------------------------------------------------------------------------ rendering


@pytest.mark.parametrize("lane", [SM90, SM89], ids=lambda l: l.name)
def test_every_config_renders(lane):
    for c in lane.space:
        for dt in OUT_DTYPES:
            if dt == "fp8" and c.kernel_schedule == "streamk":
                with pytest.raises(ValueError, match="Stream-K"):
                    render(lane, c, dt)
                continue
            src = render(lane, c, dt)
            assert c.id in src and "oasr_smm_run" in src and "cutlass::float_e4m3_t" in src
            if lane is SM90:
                assert ("FP8FastAccum" in src) == c.fast_accum
                assert ("mma_promotion_interval" in src) == (not c.fast_accum)
                assert ("StreamKScheduler" in src) == (c.kernel_schedule == "streamk")
                assert ("cutlass::layout::ColumnMajor, 0" in src) == c.swap_ab  # D^T: a column-major D
                assert ("const int rows = N, cols = M;" in src) == c.swap_ab
            else:
                assert "DefaultGemmWithVisitor" in src and "cutlass::arch::Sm89" in src
            if dt == "fp8":  # sm90: the satfinite conversion saturates, no clamp before it (DivRn)
                assert ("oasr::DivRn, ElementD" if lane is SM90 else "oasr::DivSat, ElementD") in src
    with pytest.raises(ValueError):
        render(lane, lane.space[0], "int8")


# ------------------------------------------------------------------------------------------------ quantize_


class _Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ff1 = nn.Linear(d, 4 * d)
        self.ff2 = nn.Linear(4 * d, d)
        self.odd = nn.Linear(d, 24)  # N % 16 != 0: stays full precision

    def forward(self, x):
        return self.ff2(torch.relu(self.ff1(x))), self.odd(x)


def test_quantize_model_and_report(tiers):
    torch.manual_seed(0)
    model = _Block().bfloat16()
    x = torch.randn(3, 7, 64).bfloat16()
    ref = model(x)
    oasr_ops.quantize_(model, "fp8_w8a8")
    assert isinstance(model.ff1, oasr_ops.Fp8QuantLinear) and isinstance(model.odd, nn.Linear)
    out = model(x)
    rel = (out[0].float() - ref[0].float()).abs().max() / ref[0].float().abs().max()
    assert rel < 0.1  # e4m3 weights and activations: a few % of the output's range
    rep = oasr_ops.quantization_report(model, "sm90")
    assert "scaled_mm_fp8: 2 quantized layer(s) over 2 signature(s): 0 with a tuning entry, 2 on the shape " \
           "heuristic" in rep
    _publish("system", {"scaled_mm_fp8|op=scaled_mm_fp8|N=256|K=64": {"regions": [[None, "heuristic"]]}})
    assert "1 with a tuning entry (system=1)" in oasr_ops.quantization_report(model, "sm90")
    model2 = _Block()
    oasr_ops.quantize_(model2, oasr_ops.Fp8W8A8Config(kernel="torch"), filter_fn=lambda mod, fqn: fqn == "ff2")
    assert isinstance(model2.ff2, oasr_ops.Fp8QuantLinear) and isinstance(model2.ff1, nn.Linear)
    assert model2.ff2.config == "torch" and model2.ff2.out_dtype == torch.bfloat16


def test_census_quantization_choice_lists_fp8():
    from oasr_ops.families.quantization import schemes

    assert {"int8_w8a8", "fp8_w8a8"} <= set(schemes())


# ------------------------------------------------------------------------------------------------ nvcc


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_builds_of_each_kernel_kind(monkeypatch, tmp_path):
    """Every kind of kernel, compiled for real (sm_90a / sm_89) and its C ABI checked on the CPU, in three
    builds (~1 min of nvcc each for 3.x): ping-pong + swap-AB + FastAccum + e4m3 output; Stream-K (a cooperative
    kernel) without FastAccum, fp16 output; the sm89 2.x lane."""
    from oasr_ops.codegen.jit import JitSpec, build_many

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    specs = [JitSpec.for_kernel(SM90, parse("t64x16x256_c1x1_pp_fa_swab"), "fp8", "sm90"),
             JitSpec.for_kernel(SM90, parse(SK), "fp16", "sm90"),
             JitSpec.for_kernel(SM89, parse("b64x64x64_w32x32x64_s5"), "bf16", "sm89")]
    report = build_many(specs, jobs=2, progress=False)
    assert not report.failed, report.failed
    for spec in specs:
        lib = ctypes.CDLL(str(spec.so_path))
        lib.oasr_describe.restype = ctypes.c_char_p
        assert lib.oasr_describe().decode().startswith(f"{spec.config.id}|{spec.dtype}|{spec.lane.name}|")
        assert lib.oasr_smm_abi_version() == 1
        for sym in ("oasr_smm_run", "oasr_smm_can_implement", "oasr_smm_workspace_size", "oasr_abi_version"):
            assert hasattr(lib, sym)


@pytest.mark.parametrize("op", ["scaled_mm_fp8", "scaled_mm_fp8_quant"])
def test_gate_candidates_on_cpu(op):
    """The build's gating over the real candidates and operands (on the CPU every arm runs the reference, so
    every gate passes), and a representative that fails its tolerance gate takes its bitwise group with it."""
    from dataclasses import replace

    from oasr_ops.families.candidate import Candidate
    from oasr_ops.runtime.db_signatures import parse_signature
    from oasr_ops.tune.candidates import gate_candidates
    from oasr_ops.tune.points import Point

    sig = f"scaled_mm_fp8|op={op}|N=256|K=512"
    cands = fcand.candidates(parse_signature(sig), "sm90")
    pt = Point(37, signature=sig, family="scaled_mm_fp8", op=op, n=256, k=512)
    operands = fcand.operands(pt, "cpu", seed=1, copies=2)
    passed, rejected = gate_candidates(cands, operands)
    assert not rejected and len(passed) == len(cands)
    # break the non-FastAccum group's representative: it fails the tolerance gate, its members the bitwise one
    rep = next(c for c in cands if c.id != "torch" and c.gate.kind == "tolerance" and "promote128" ==
               summation_order(parse(c.id)))

    def broken(o, config, copy, _bind=rep.bind):
        call = _bind(o, config, copy)
        return lambda: (-call().float()).to(call().dtype)  # a sign error: wrong by 2|y| everywhere

    cands2 = [replace(c, bind=broken) if c.id == rep.id else c for c in cands]
    assert isinstance(cands2[1], Candidate)
    passed, rejected = gate_candidates(cands2, operands)
    members = [c.id for c in cands if c.gate.kind == "bitwise" and c.gate.baseline == rep.id]
    assert rep.id in rejected and members and all("baseline" in rejected[m] for m in members)
    assert "torch" not in rejected and "heuristic" not in rejected
    if op == "scaled_mm_fp8_quant":
        assert not operands.variants  # e4m3 output: nothing else is served
        return
    # the plain op is gated in fp16 output too (the DB serves both): a tile wrong only in fp16 is rejected, and
    # the reason names the variant; its bitwise group goes with it
    assert [v.label for v in operands.variants] == ["fp16 output"]

    def wrong_in_fp16(o, config, copy, _bind=rep.bind):
        call = _bind(o, config, copy)

        def run():
            y = call()
            return (-y.float()).to(y.dtype) if y.dtype == torch.float16 else y
        return run

    cands3 = [replace(c, bind=wrong_in_fp16) if c.id == rep.id else c for c in cands]
    passed, rejected = gate_candidates(cands3, operands)
    assert "fp16 output" in rejected[rep.id] and all(m in rejected for m in members)
    assert {c.id for c in passed} == {c.id for c in cands} - {rep.id, *members}
    passed, rejected = gate_candidates(cands3, replace(operands, variants=[]))  # bf16 alone: all pass
    assert not rejected


def test_the_quantizing_ops_arms_time_the_fused_fc1():
    """``op=scaled_mm_fp8_quant`` entries serve the fused fc1 (`scaled_mm_fp8_act_quant`, what a deployment runs
    there): every arm binds that op with the build's activation, and prebuild --census builds its variant (the
    plain op's exact division ranked the tiles differently, session 39)."""
    from oasr_ops.families.scaled_mm_fp8 import act_quant
    from oasr_ops.runtime.db_signatures import parse_signature
    from oasr_ops.tune.points import Point

    parts = parse_signature(QSIG)
    assert fcand.measure_dtype(parts) == "fp8_gelu" == f"fp8_{fcand.BUILD_ACTIVATION}"
    pt = Point(37, signature=QSIG, family="scaled_mm_fp8", op="scaled_mm_fp8_quant", n=parts.n, k=parts.k)
    operands = fcand.operands(pt, "cpu", seed=1)
    for cand in fcand.candidates(parts, "sm90"):
        y = cand.bind(operands, cand.id, 0)()
        ref = act_quant.reference_scaled_mm_fp8_act_quant(operands.acts["a"], operands.weights[0]["w"],
                                                          operands.acts["sa"], operands.consts["sw"], None,
                                                          operands.consts["out_scale"], fcand.BUILD_ACTIVATION)
        assert torch.equal(y.float(), ref.float()), cand.id  # the CPU impl of the fused op: its reference
    # the gate's float64 reference applies the activation before the quantization: GELU's minimum is about -0.17,
    # so no value falls below -0.2 / out_scale (without the activation they reach about -max)
    r = operands.reference()
    floor = -0.2 / float(operands.consts["out_scale"])
    assert r.shape == (37, parts.n) and float(r.min()) > floor and float(r.max()) > -10 * floor
