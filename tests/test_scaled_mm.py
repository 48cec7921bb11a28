"""int8 W8A8 scaled_mm family on the CPU: op schemas and fakes, exact reference numerics, error paths, selection
rules (tiers, Stream-K only from measured entries, the quantizing op never serving Stream-K, the heuristic),
rendering of every int8 config, and `quantize_` on a small model."""
from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops import paths
from oasr_ops.codegen.emit_int8 import OUT_DTYPES
from oasr_ops.runtime.registry import LANES, get_lane
from oasr_ops.codegen.render import render
from oasr_ops.quantize import QuantLinear, quantization_report, quantize_
from oasr_ops.tune import database as db

smm = sys.modules["oasr_ops.families.scaled_mm.ops"]

SM90 = get_lane("sm90_int8_wgmma")
SM80 = get_lane("sm80_int8_mma")
SK = "t128x128x128_c1x1_sk"
SK64 = "t128x64x128_c1x1_sk"
DP = "t64x128x128_c1x1_pp"
BIG = "t128x256x128_c1x1_coop"


def _inputs(m, n, k, *, per_token=True, per_channel=True, seed=0, lead=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    sa = (torch.rand(m if per_token else 1, generator=g) * 1e-3 + 1e-4).float()
    sw = (torch.rand(n if per_channel else 1, generator=g) * 1e-3 + 1e-4).float()
    if lead is not None:
        a = a.reshape(*lead, k)
    return a, w, sa, sw


def _fp32_formula(a, w, sa, sw, bias):
    acc = (a.reshape(-1, a.shape[-1]).long() @ w.long().t()).to(torch.int32)
    y = sa.reshape(-1, 1) * (sw.reshape(1, -1) * acc.float())
    return y if bias is None else y + bias.float()


# ------------------------------------------------------------------------------------------------ ops


def test_lanes_registered():
    assert LANES["sm90_int8_wgmma"].family == "scaled_mm" and LANES["sm80_int8_mma"].family == "scaled_mm"
    assert len(SM90.space) == 9
    assert sum(c.kernel_schedule == "streamk" for c in SM90.space) == 2
    assert all(c.tile[2] == 128 for c in SM90.space)
    from oasr_ops.runtime.registry import native_lane

    assert native_lane("sm90", "scaled_mm") is SM90 and native_lane("sm89", "scaled_mm") is SM80
    assert native_lane("sm90").name == "sm90_f16_wgmma"  # the gemm family is unchanged


@pytest.mark.parametrize("per_token,per_channel", [(True, True), (False, False), (True, False), (False, True)])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_reference_is_the_exact_formula(per_token, per_channel, out_dtype, with_bias):
    m, n, k = 37, 48, 256
    a, w, sa, sw = _inputs(m, n, k, per_token=per_token, per_channel=per_channel)
    bias = torch.randn(n).to(out_dtype) if with_bias else None
    y = oasr_ops.scaled_mm(a, w, sa, sw, bias, out_dtype)
    assert y.dtype == out_dtype and y.shape == (m, n)
    # bitwise: the fp32 formula rounded once
    assert torch.equal(y, _fp32_formula(a, w, sa, sw, bias).to(out_dtype))
    # and within an ulp of the exact value (float64 composite)
    exact = sa.double().reshape(-1, 1) * sw.double().reshape(1, -1) * (a.double() @ w.double().t())
    if bias is not None:
        exact = exact + bias.double()
    ulp = 2.0 ** -10 if out_dtype == torch.float16 else 2.0 ** -7
    assert torch.all((y.double() - exact).abs() <= exact.abs() * ulp + 1e-6)


def test_leading_dims_and_config_args():
    a, w, sa, sw = _inputs(12, 32, 64, lead=(3, 4))
    y = oasr_ops.scaled_mm(a, w, sa, sw)
    assert y.shape == (3, 4, 32) and y.dtype == torch.float16
    for cfg in ("auto", "heuristic", "torch", SK, "b128x128x64_w64x64x64_s3", "regions:64=t64x64x128_c1x1_pp;*=heuristic"):
        assert torch.equal(oasr_ops.scaled_mm(a, w, sa, sw, config=cfg), y)


def test_accumulator_is_exact_int32():
    # worst case magnitudes: the float64 path must be exact (float32 would not be)
    k = 4096
    a = torch.full((2, k), -128, dtype=torch.int8)
    a[1, ::2] = 127
    w = torch.full((16, k), -128, dtype=torch.int8)
    acc = smm.int_acc(a, w)
    assert acc.dtype == torch.int32
    assert acc[0, 0].item() == 128 * 128 * k
    assert acc[1, 0].item() == (k // 2) * 127 * -128 + (k // 2) * 128 * 128
    assert torch.equal(acc.long(), a.long() @ w.long().t())


def test_quant_op_reference():
    m, n, k = 20, 32, 128
    a, w, sa, sw = _inputs(m, n, k)
    bias = torch.randn(n)
    y = _fp32_formula(a, w, sa, sw, bias)
    for out_scale in (torch.tensor([y.abs().max().item() / 100]), (y.abs().amax(1) / 127).float()):
        q = oasr_ops.scaled_mm_quant(a, w, sa, sw, out_scale, bias)
        assert q.dtype == torch.int8 and q.shape == (m, n)
        expect = torch.round(y / out_scale.reshape(-1, 1)).clamp(-128, 127).to(torch.int8)
        assert torch.equal(q, expect)
    # saturation
    q = oasr_ops.scaled_mm_quant(a, w, sa, sw, torch.tensor([1e-9]))
    assert set(q.unique().tolist()) <= {-128, 0, 127}


def test_quantize_per_token():
    x = torch.randn(3, 5, 64) * 4
    x[0, 0] = 0  # an all-zero row keeps a finite scale
    q, s = oasr_ops.quantize_per_token(x)
    assert q.dtype == torch.int8 and q.shape == x.shape and s.shape == (15,) and s.dtype == torch.float32
    assert torch.isfinite(s).all() and q.abs().max() <= 127
    err = (q.float() * s.reshape(3, 5, 1) - x).abs()
    assert torch.all(err <= s.reshape(3, 5, 1) / 2 + 1e-6)
    assert q.reshape(15, 64).abs().amax(1)[1:].eq(127).all()


def test_opcheck():
    a, w, sa, sw = _inputs(19, 32, 64)
    bias = torch.randn(32).half()
    torch.library.opcheck(torch.ops.oasr.scaled_mm.default, (a, w, sa, sw, bias, torch.float16, "auto"))
    torch.library.opcheck(torch.ops.oasr.scaled_mm.default, (a, w, sa[:1], sw[:1], None, torch.bfloat16, "torch"))
    torch.library.opcheck(torch.ops.oasr.scaled_mm_quant.default,
                          (a, w, sa, sw, bias.float(), torch.tensor([0.5]), "auto"))
    torch.library.opcheck(torch.ops.oasr.quantize_per_token.default, (torch.randn(7, 64),))


def test_fake_and_compile():
    a, w, sa, sw = _inputs(8, 32, 64)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fw, fsa, fsw = (mode.from_tensor(t) for t in (a, w, sa, sw))
        out = torch.ops.oasr.scaled_mm(fa, fw, fsa, fsw, None, torch.bfloat16, "auto")
        assert out.shape == (8, 32) and out.dtype == torch.bfloat16
        q = torch.ops.oasr.scaled_mm_quant(fa, fw, fsa, fsw, None, mode.from_tensor(torch.ones(1)), "auto")
        assert q.dtype == torch.int8
        with pytest.raises(ValueError, match="multiple of 16"):
            torch.ops.oasr.scaled_mm(mode.from_tensor(torch.zeros(8, 24, dtype=torch.int8)),
                                     mode.from_tensor(torch.zeros(32, 24, dtype=torch.int8)), fsa, fsw, None,
                                     torch.float16, "auto")

    def f(x, wq, sw_):
        q, s = torch.ops.oasr.quantize_per_token(x)
        return torch.ops.oasr.scaled_mm(q, wq, s, sw_, None, torch.float16, "auto")

    x = torch.randn(8, 64)
    eager = f(x, w, sw)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, sw)
    assert torch.equal(eager, compiled)


@pytest.mark.parametrize("case,match", [
    ("a_dtype", "must be int8"),
    ("w_dtype", "must be int8"),
    ("k_align", "multiple of 16"),
    ("n_align", "multiple of 8"),
    ("k_mismatch", "K mismatch"),
    ("w_dim", "2-D"),
    ("sa_dtype", "scale_a must be float32"),
    ("sa_shape", r"scale_a must have shape \[1\]"),
    ("sw_shape", r"scale_w must have shape \[1\]"),
    ("sw_2d", r"scale_w must have shape"),
    ("bias_dtype", "bias must have dtype"),
    ("bias_shape", "bias must have shape"),
    ("out_dtype", "out_dtype must be"),
    ("config", "unknown config"),
])
def test_errors(case, match):
    a, w, sa, sw = _inputs(16, 32, 64)
    bias, out_dtype, config = None, torch.float16, "auto"
    if case == "a_dtype":
        a = a.half()
    elif case == "w_dtype":
        w = w.float()
    elif case == "k_align":
        a, w = a[:, :40].contiguous(), w[:, :40].contiguous()
    elif case == "n_align":
        w, sw = w[:12].contiguous(), sw[:12].contiguous()
    elif case == "k_mismatch":
        w = w[:, :48].contiguous()
    elif case == "w_dim":
        w = w.reshape(1, 32, 64)
    elif case == "sa_dtype":
        sa = sa.double()
    elif case == "sa_shape":
        sa = sa[:5]
    elif case == "sw_shape":
        sw = sw[:7]
    elif case == "sw_2d":
        sw = sw.reshape(32, 1)
    elif case == "bias_dtype":
        bias = torch.zeros(32)
    elif case == "bias_shape":
        bias = torch.zeros(16, dtype=torch.float16)
    elif case == "out_dtype":
        out_dtype = torch.float32
    elif case == "config":
        config = "t1x2x3"
    with pytest.raises(ValueError, match=match):
        oasr_ops.scaled_mm(a, w, sa, sw, bias, out_dtype, config)


def test_quant_errors():
    a, w, sa, sw = _inputs(16, 40, 64)
    with pytest.raises(ValueError, match="multiple of 16"):  # N % 16 for the int8 output
        oasr_ops.scaled_mm_quant(a, w, sa, sw, torch.ones(1))
    a, w, sa, sw = _inputs(16, 32, 64)
    with pytest.raises(ValueError, match="out_scale must have shape"):
        oasr_ops.scaled_mm_quant(a, w, sa, sw, torch.ones(32))
    with pytest.raises(ValueError, match="bias must have dtype"):
        oasr_ops.scaled_mm_quant(a, w, sa, sw, torch.ones(1), torch.zeros(32, dtype=torch.float16))
    with pytest.raises(ValueError, match="out_scale must be float32"):
        oasr_ops.scaled_mm_quant(a, w, sa, sw, torch.ones(1, dtype=torch.float16))


# ------------------------------------------------------------------------------------------------ selection


@pytest.fixture
def tiers(tmp_path, monkeypatch):
    user, system = tmp_path / "user", tmp_path / "system"
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(user))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    monkeypatch.delenv("OASR_GEMM_COMPILE_SET", raising=False)
    monkeypatch.setattr(paths, "system_db_dir", lambda: system)
    db.reload()
    smm.reset_selection()
    yield
    monkeypatch.undo()
    db.reload()
    smm.reset_selection()


def _publish(tier, entries):
    db.publish("scaled_mm", entries, tier=tier, arch="sm90")
    db.reload()


SIG = "scaled_mm|op=scaled_mm|N=768|K=256"
QSIG = "scaled_mm|op=scaled_mm_quant|N=768|K=256"


def test_fallback_plugin_gives_the_ladder(tiers):
    from oasr_ops.runtime import select as tsel

    tsel.register_fallback("scaled_mm", smm._fallback_plugin)
    db.reload()
    try:
        s = tsel.select_config("scaled_mm", "scaled_mm", "int8", 768, 256, 100)
        assert s.tier == "heuristic" and s.config == smm.heuristic_config(100, 768, 256, "sm90")
        assert smm.select_config(768, 256, 100) == smm.Selection(s.config, "heuristic", SIG)
    finally:
        tsel.register_fallback("scaled_mm", None)
        db.reload()


def test_heuristic_fallback_when_untuned(tiers):
    s = smm.select_config(768, 256, 100)
    assert s.tier == "heuristic" and s.signature == SIG
    assert s.config == smm.heuristic_config(100, 768, 256, "sm90")
    assert SM90.get(s.config).kernel_schedule != "streamk"
    assert smm.resolution_counts() == {"scaled_mm": {"heuristic": 1}}
    smm.select_config(768, 256, 100)  # memoised: no new resolution
    assert smm.resolution_counts() == {"scaled_mm": {"heuristic": 1}}


def test_tiers_regions_and_measured_heuristic(tiers):
    _publish("system", {SIG: {"regions": [[64, DP], [1024, "heuristic"], [None, BIG]]}})
    _publish("user", {SIG: {"regions": [[16, SK64]]}})
    assert smm.select_config(768, 256, 8) == smm.Selection(SK64, "user", SIG)  # measured: Stream-K allowed
    assert smm.select_config(768, 256, 17) == smm.Selection(DP, "system", SIG)  # rounds up to 64
    s = smm.select_config(768, 256, 500)  # a measured "heuristic" region
    assert s.tier == "system" and s.config == smm.heuristic_config(500, 768, 256, "sm90")
    assert smm.select_config(768, 256, 100000) == smm.Selection(BIG, "system", SIG)
    assert smm.resolution_counts()["scaled_mm"] == {"system": 3, "user": 1}
    # a reload starts a new epoch: selections are re-resolved
    _publish("user", {SIG: {"regions": [[None, "heuristic"]]}})
    assert smm.select_config(768, 256, 100000).tier == "user"


def _write_raw(root, entries):
    """A file written by hand (publish refuses a Stream-K region for a quantizing op)."""
    import json

    from oasr_ops.runtime import validators as val

    doc = {"schema": 2, "kernel_family": "scaled_mm", "arch_family": "sm90", "lane": SM90.name,
           "validators": val.current_soft_validators(SM90.name), "configs": {}, "entries": entries}
    p = root / "sm90" / "scaled_mm.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    db.reload()


def test_quant_never_serves_stream_k(tiers):
    _write_raw(paths.system_db_dir(), {QSIG: {"regions": [[64, SK], [None, DP]]}, SIG: {"regions": [[64, SK]]}})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s1 = smm.select_quant_config(768, 256, 32)
        s2 = smm.select_quant_config(768, 256, 48)
    assert s1.tier == "heuristic" and SM90.get(s1.config).kernel_schedule != "streamk"
    assert s2.config == s1.config
    msgs = [str(w.message) for w in rec if "Stream-K" in str(w.message)]
    assert len(msgs) == 1, msgs  # warned once
    assert smm.select_quant_config(768, 256, 1000) == smm.Selection(DP, "system", QSIG)
    assert smm.select_config(768, 256, 32) == smm.Selection(SK, "system", SIG)  # the plain op may


def test_stream_k_only_from_measured_entries(tiers, monkeypatch):
    # the heuristic never answers Stream-K, whatever the shape
    for m in (1, 7, 16, 17, 64, 127, 1000, 4096, 16384):
        for n, k in ((256, 256), (1024, 4096), (4096, 1024), (256, 16384)):
            assert SM90.get(smm.heuristic_config(m, n, k, "sm90")).kernel_schedule != "streamk"
            assert SM80.get(smm.heuristic_config(m, n, k, "sm80")).kernel_schedule == "multistage"
    # a plug-in (e.g. a cost model) naming Stream-K is not a measured entry: skipped
    from oasr_ops.runtime import select as tsel

    tsel.register_fallback("scaled_mm", lambda lane, m, n, k, dt: SK)
    db.reload()
    try:
        with pytest.warns(UserWarning, match="did not come from a measured entry"):
            s = smm.select_config(768, 256, 5)
        assert s.tier == "heuristic" and SM90.get(s.config).kernel_schedule != "streamk"
    finally:
        tsel.register_fallback("scaled_mm", None)
        db.reload()


def test_outside_production_set_is_skipped(tiers, monkeypatch):
    from oasr_ops.runtime import production

    monkeypatch.setattr(production, "family_production_configs", lambda family, arch: [SM90.default])
    _publish("system", {SIG: {"regions": [[None, BIG]]}})
    with pytest.warns(UserWarning, match="outside this process's production set"):
        s = smm.select_config(768, 256, 4096)
    assert s.tier == "heuristic" and s.config == smm.heuristic_config(4096, 768, 256, "sm90")


def test_other_lanes_config_falls_through(tiers):
    # an entry naming the 2.x lane's config in an sm90 file is skipped (a hole): the heuristic answers
    _write_raw(paths.system_db_dir(), {SIG: {"regions": [[None, "b128x128x64_w64x64x64_s3"]]}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = smm.select_config(768, 256, 4096)
    assert s.tier == "heuristic" and s.config in SM90.ids()


def test_production_set_contains_db_refs(tiers):
    _publish("system", {SIG: {"regions": [[64, SK64]]}})
    ids = {c.id for c in smm.production_configs("sm90")}
    assert SK64 in ids and SM90.default.id in ids
    assert set(smm.heuristic_ids(SM90)) <= ids


def test_no_arch_means_reference(monkeypatch):
    monkeypatch.delenv("OASR_ARCH", raising=False)
    smm.reset_selection()
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert smm.select_config(768, 256, 10).config == "torch"


def test_variants_for():
    v = smm.variants_for(768, 256, False, arch="sm90")
    assert len(v) == 9 and SK in v
    q = smm.variants_for(768, 256, True, arch="sm90")
    assert len(q) == 7 and not any(c.endswith("_sk") for c in q)
    assert smm.variants_for(768, 100, False, arch="sm90") == []
    assert smm.variants_for(40, 256, True, arch="sm90") == []  # N % 16 for the int8 output
    assert smm.variants_for(40, 256, False, arch="sm90") != []
    assert set(smm.variants_for(512, 512, False, arch="sm89")) <= set(SM80.ids())


_GRID_M = (1, 7, 16, 17, 64, 65, 127, 128, 500, 1000, 4096, 10000, 16384, 65536)
_GRID_NK = ((256, 256), (768, 256), (1024, 4096), (4096, 1024), (256, 16384), (512, 19456), (4096, 4096),
            (8192, 8192))


def test_wave_model_table():
    model = smm._INT8_WAVE_MODEL["sm90_int8_wgmma"]
    # every data-parallel tile of the lane, no Stream-K, no foreign id
    assert set(model) == {c.id for c in SM90.space if c.kernel_schedule != "streamk"}
    assert set(smm.heuristic_ids(SM90)) == set(model)
    assert set(smm.heuristic_ids(SM80)) == {cid for cid, _ in smm._INT8_LADDER["sm80_int8_mma"]} <= set(SM80.ids())
    for cid, coef in model.items():
        assert len(coef) == len(smm.wave_features(64, 64, 1, 8, 16, 132))
        assert all(c >= 0 for c in coef), cid  # non-negative: the predicted time is monotone in M, N and K
        assert coef[0] > 0  # a launch floor: no tile is predicted free


def test_wave_model_time_is_monotone():
    for cid, coef in smm._INT8_WAVE_MODEL["sm90_int8_wgmma"].items():
        tm, tn = SM90.get(cid).tile[:2]

        def t(m, n, k):
            return smm.wave_model_time(coef, tm, tn, m, n, k, 132)
        for m in _GRID_M:
            for n, k in _GRID_NK:
                assert t(m, n, k) > 0
                assert t(m + 1, n, k) >= t(m, n, k) and t(m, n + 8, k) >= t(m, n, k) and t(m, n, k + 16) >= t(m, n, k)
        assert t(4096, 4096, 4096) > t(4096, 4096, 1024) > t(1024, 4096, 1024)


def test_heuristic_answers_are_data_parallel_tiles_of_the_lane():
    for m in _GRID_M:
        for n, k in _GRID_NK:
            c90 = smm.heuristic_config(m, n, k, "sm90")
            assert c90 in SM90.ids() and SM90.get(c90).kernel_schedule != "streamk"
            assert c90 == smm.heuristic_config(m, n, k, "sm90", SM90)  # lane given or looked up: one answer
            if not torch.cuda.is_available():  # (on a GPU both use its SM count)
                assert c90 == smm._fallback_plugin(SM90, m, n, k, "int8")
            c80 = smm.heuristic_config(m, n, k, "sm80")
            assert c80 in {cid for cid, _ in smm._INT8_LADDER["sm80_int8_mma"]}
    assert smm.heuristic_config(0, 768, 256, "sm90") == smm.heuristic_config(1, 768, 256, "sm90")  # M clamps to 1
    assert smm.heuristic_config(16, 768, 256, "sm75") == "torch"  # no native lane


def test_heuristic_is_deterministic_and_pure():
    shapes = [(m, n, k) for m in _GRID_M for n, k in _GRID_NK]
    first = [smm.heuristic_config(*s, "sm90") for s in shapes]
    assert [smm.heuristic_config(*s, "sm90") for s in reversed(shapes)] == first[::-1]
    # an exact tie goes to the first tile listed
    tie = {"t64x128x128_c1x1_pp": (1.0, 0, 0, 0, 0), "t64x64x128_c1x1_pp": (1.0, 0, 0, 0, 0)}
    assert smm.wave_model_config(tie, 100, 768, 256, 132) == "t64x128x128_c1x1_pp"


def test_heuristic_tile_follows_the_shape():
    def tile(m, n, k):
        return SM90.get(smm.heuristic_config(m, n, k, "sm90")).tile
    # a handful of rows: a 64-row tile, whatever N and K (a 128-row tile would be mostly padding)
    for m in (1, 7, 16, 17, 64):
        for n, k in _GRID_NK:
            assert tile(m, n, k)[0] == 64, (m, n, k)
    # few output tiles over a deep K: the smallest tile spreads the work over the most SMs
    assert tile(16, 1024, 16384)[:2] == (64, 64)
    # many rows and columns: a large tile (at least 128x128; every wave fills the GPU, so per-tile efficiency wins)
    for m in (16384, 65536):
        for n, k in ((1024, 1024), (2048, 512), (4096, 1024), (4096, 4096), (8192, 8192)):
            t = tile(m, n, k)
            assert t[0] * t[1] >= 128 * 128, (m, n, k, t)
    # fewer SMs -> at least as many waves: never a faster prediction (the model sees the GPU's SM count)
    for cid, coef in smm._INT8_WAVE_MODEL["sm90_int8_wgmma"].items():
        tm, tn = SM90.get(cid).tile[:2]
        for m in (64, 4096, 16384):
            assert (smm.wave_model_time(coef, tm, tn, m, 4096, 4096, 66)
                    >= smm.wave_model_time(coef, tm, tn, m, 4096, 4096, 132))


def test_wave_model_matches_the_measurements_it_was_fitted_on():
    # the shipped table against its own data (benchmarks/int8_ladder_points.json): guards a mangled table, not a
    # timing claim (held-out scores: benchmarks/fit_int8_ladder.py)
    import json
    import math
    from pathlib import Path

    f = Path(__file__).resolve().parent.parent / "benchmarks" / "int8_ladder_points.json"
    if not f.exists():
        pytest.skip("no measurement file in this checkout")
    data = json.loads(f.read_text())
    logs = []
    for p in data["points"]:
        dp = {c: t for c, t in p["us"].items() if SM90.get(c).kernel_schedule != "streamk"}
        pick = smm.wave_model_config(smm._INT8_WAVE_MODEL[data["lane"]], p["M"], p["N"], p["K"], data["sms"])
        logs.append(math.log(dp[pick] / min(dp.values())))
    assert math.exp(sum(logs) / len(logs)) - 1 < 0.01  # the spec's bar: within 1 % geomean of the best tile


# ------------------------------------------------------------------------------------------------ codegen


@pytest.mark.parametrize("lane", [SM90, SM80], ids=lambda l: l.name)
def test_every_config_renders(lane):
    for c in lane.space:
        for dt in OUT_DTYPES:
            if dt == "int8" and c.kernel_schedule == "streamk":
                with pytest.raises(ValueError, match="Stream-K"):
                    render(lane, c, dt)
                continue
            src = render(lane, c, dt)
            assert c.id in src and "oasr_smm_run" in src and "oasr_abi_version" in src
            assert "int8_t" in src and "int32_t" in src
            if lane is SM90:
                assert "Sm90ColBroadcast" in src and "Sm90RowBroadcast" in src and "Sm90AccFetch" in src
                assert "KernelTmaWarpSpecialized" in src
                assert ("StreamKScheduler" in src) == (c.kernel_schedule == "streamk")
                assert f"cute::_{c.tile[0]}, cute::_{c.tile[1]}, cute::_{c.tile[2]}" in src
            else:
                assert "VisitorColBroadcast" in src and "DefaultGemmWithVisitor" in src
                assert "OpMultiplyAddSaturate" in src
            if dt == "int8":
                assert "oasr::QuantRn, ElementD" in src
            else:
                assert f"using ElementD = {'cutlass::half_t' if dt == 'fp16' else 'cutlass::bfloat16_t'}" in src
    with pytest.raises(ValueError):
        render(lane, lane.space[0], "fp32")


def test_fp16_render_unchanged():
    """The fp16 lanes still render through their own path (cache keys of built fp16 kernels must not move)."""
    lane = get_lane("sm90_f16_wgmma")
    src = render(lane, lane.default, "fp16")
    assert "oasr_smm_run" not in src and "BiasAct" in src


def test_jit_spec_names():
    from oasr_ops.codegen.jit import JitSpec

    s = JitSpec.for_kernel(SM90, SM90.get(SK), "bf16")
    assert s.name == f"sm90_int8_wgmma_{SK}_bf16_sm90a" and len(s.key) == 20
    s2 = JitSpec.for_kernel(SM80, SM80.default, "int8", "sm90")
    assert s2.cuda_arch == "90"


# ------------------------------------------------------------------------------------------------ quantize_


class _Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ff1 = nn.Linear(d, 4 * d)
        self.ff2 = nn.Linear(4 * d, d)
        self.odd = nn.Linear(d, 12)  # N % 8 != 0: stays full precision
        self.skinny = nn.Linear(20, 16)  # K % 16 != 0: stays

    def forward(self, x):
        h = self.ff2(torch.relu(self.ff1(x)))
        return h, self.odd(x), self.skinny(x[..., :20])


def test_quantize_model_matches_within_int8_tolerance():
    torch.manual_seed(0)
    model = nn.Sequential(_Block(), )
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        ref = model(x)
    out_model = quantize_(model, "int8_w8a8")
    assert out_model is model
    blk = model[0]
    assert isinstance(blk.ff1, QuantLinear) and isinstance(blk.ff2, QuantLinear)
    assert type(blk.odd) is nn.Linear and type(blk.skinny) is nn.Linear
    assert blk.ff1.weight_q.dtype == torch.int8 and blk.ff1.scale_w.shape == (256,)
    with torch.no_grad():
        out = model(x)
    h, h_ref = out[0], ref[0]
    assert h.dtype == torch.float32 and h.shape == h_ref.shape
    rel = (h - h_ref).norm() / h_ref.norm()
    assert rel < 0.03, rel
    assert torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2])
    text = quantization_report(model)
    assert text.startswith("scaled_mm: 2 quantized layer(s) over 2 signature(s):")


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_dtype_moves_of_a_quantized_model_keep_its_weights_and_scales(scheme):
    """nn.Module.to(dtype) casts every floating buffer: it turned the fp32 scales (and an e4m3 weight) into bf16,
    and every later call failed. Now a dtype move reaches the output dtype only, fp16 / bf16; .float() keeps it
    (one warning); calibrated scales survive; the outputs are the same bits."""
    import warnings

    from oasr_ops.families.scaled_mm import quantize as q

    torch.manual_seed(0)
    m = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256)).bfloat16().eval()
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    quantize_(m, scheme)
    layer = m[1]
    layer.input_scale = torch.tensor([0.02])
    wdt, ref = layer.weight_q.dtype, m(x)
    scales = layer.scales.clone()
    m.to(torch.bfloat16)
    assert torch.equal(m(x), ref) and layer.weight_q.dtype == wdt and torch.equal(layer.scales, scales)
    m.half()
    assert layer.out_dtype == torch.float16 and m(x.half()).dtype == torch.float16
    assert layer.weight_q.dtype == wdt and torch.equal(layer.scales, scales)
    q._WARN_DTYPE.clear()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        m.float()
        m.double()
    msgs = [str(w.message) for w in got if "quantized layer outputs" in str(w.message)]
    assert len(msgs) == 1 and "keeps torch.float16" in msgs[0]
    assert layer.out_dtype == torch.float16 and layer.weight_q.dtype == wdt and torch.equal(layer.scales, scales)
    assert m[0].weight.dtype == torch.float64  # the rest of the model did move


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_quantize_multihead_attention_through_its_linears(scheme, dtype):
    """nn.MultiheadAttention reads out_proj's weight instead of calling it: a swapped out_proj broke an fp32 model
    (a 16-bit dequantized weight in an fp32 matmul) and ran in 16-bit in an fp16 one. quantize_ now converts the
    module to LinearMultiheadAttention, whose projections it calls (both quantized, the model in its dtype, within
    the scheme's accuracy); a module it cannot convert (add_zero_attn) keeps its NonDynamicallyQuantizableLinear
    out_proj untouched, whatever filter_fn says."""
    torch.manual_seed(0)

    class Layer(nn.Module):
        def __init__(self, **kw) -> None:
            super().__init__()
            self.attn, self.fc = nn.MultiheadAttention(64, 4, batch_first=True, **kw), nn.Linear(64, 64)

        def forward(self, x):
            return self.fc(self.attn(x, x, x, need_weights=False)[0])

    quantized = ("QuantLinear", "Fp8QuantLinear")
    model = Layer().to(dtype).eval()
    x = torch.randn(2, 9, 64, dtype=dtype)
    with torch.no_grad():
        want = model.attn(x, x, x, need_weights=False)[0]
    quantize_(model, scheme, filter_fn=lambda m, fqn: True)
    assert type(model.attn.in_proj).__name__ in quantized and type(model.attn.out_proj).__name__ in quantized
    assert type(model.fc).__name__ in quantized
    with torch.no_grad():
        got = model.attn(x, x, x, need_weights=False)[0]
        assert got.dtype == dtype and model(x).shape == (2, 9, 64)
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    assert err < (3e-2 if scheme == "int8_w8a8" else 1.5e-1), err

    kept = Layer(add_zero_attn=True).to(dtype).eval()
    with torch.no_grad():
        want = kept.attn(x, x, x, need_weights=False)[0]
    quantize_(kept, scheme, filter_fn=lambda m, fqn: True)
    assert type(kept.attn.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    with torch.no_grad():
        assert torch.equal(kept.attn(x, x, x, need_weights=False)[0], want)


def test_quantize_half_model_and_report(tiers):
    lin = nn.Linear(256, 768).half()
    model = nn.Sequential(lin, nn.ReLU(), nn.Linear(768, 256).half(), nn.Linear(256, 768).half())
    quantize_(model)
    assert all(isinstance(model[i], QuantLinear) for i in (0, 2, 3))
    assert model[0].bias.dtype == torch.float16 and model[0].out_dtype == torch.float16
    y = model(torch.randn(5, 256).half())
    assert y.dtype == torch.float16 and y.shape == (5, 768)
    _publish("system", {SIG: {"regions": [[None, "heuristic"]]}})
    assert quantization_report(model) == ("scaled_mm: 3 quantized layer(s) over 2 signature(s): 2 with a tuning "
                                          "entry (system=2), 1 on the shape heuristic")
    with pytest.raises(ValueError, match="unknown scheme"):
        quantize_(model, "int4")


def test_heuristic_beyond_the_wave_models_range_takes_the_largest_tile():
    import sys

    smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
    model = smm._INT8_WAVE_MODEL["sm90_int8_wgmma"]
    largest = max(model, key=lambda c: smm._tile_mn(c)[0] * smm._tile_mn(c)[1])
    m_max, n_max, k_max = smm._WAVE_MODEL_RANGE["sm90_int8_wgmma"]
    for m, n, k in ((m_max + 1, 512, 512), (4096, n_max + 8, 512), (4096, 4096, k_max + 16), (8192, 8192, 8192)):
        assert smm.heuristic_config(m, n, k, "sm90") == largest
    # ... only where it fills a wave of SMs; elsewhere, and inside the range, the model decides
    assert smm.heuristic_config(1, 8192, 8192, "sm90") != largest
    assert smm.heuristic_config(16, 512, 512, "sm90") != largest


def test_quantize_filter_fn_selects_layers_by_fqn():
    from torch import nn

    import oasr_ops
    from oasr_ops.quantize import QuantLinear

    model = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 32)))
    seen = []

    def only_nested(m, fqn):
        seen.append(fqn)
        return fqn.startswith("2.")

    oasr_ops.quantize_(model, "int8_w8a8", filter_fn=only_nested)
    assert sorted(seen) == ["0", "2.0", "2.1"]
    assert isinstance(model[0], nn.Linear) and not isinstance(model[0], QuantLinear)
    assert isinstance(model[2][0], QuantLinear) and isinstance(model[2][1], QuantLinear)
    x = torch.randn(5, 32)
    assert model(x).shape == (5, 32)


def test_out_scale_check_reads_a_checked_tensor_again_only_after_it_changes():
    a, w, sa, sw = _inputs(16, 32, 64)
    s = torch.tensor([0.05])
    oasr_ops.scaled_mm_quant(a, w, sa, sw, s)  # checked once, remembered
    s.zero_()  # in place: the version counter moves, so the next call reads the values again
    with pytest.raises(ValueError, match="finite and > 0"):
        oasr_ops.scaled_mm_quant(a, w, sa, sw, s)
    s.fill_(0.05)
    oasr_ops.scaled_mm_quant(a, w, sa, sw, s)
    with torch.inference_mode():  # no version counter: checked on every call
        bad = torch.tensor([float("nan")])
        for _ in range(2):
            with pytest.raises(ValueError, match="finite and > 0"):
                oasr_ops.scaled_mm_quant(a, w, sa, sw, bad)


def test_the_quantizing_ops_arms_time_the_fused_fc1():
    """``op=scaled_mm_quant`` entries serve the fused fc1 (`scaled_mm_act_quant`): every arm runs that op with the
    build's activation (bitwise equal across tiles, as the plain op's), and prebuild --census builds its variant."""
    from oasr_ops.codegen.variants import act_variant
    from oasr_ops.families.scaled_mm import candidates as icand
    from oasr_ops.families.scaled_mm.act_quant import reference_scaled_mm_act_quant
    from oasr_ops.runtime.db_signatures import parse_signature
    from oasr_ops.tune.points import Point

    parts = parse_signature(QSIG)
    assert icand.measure_dtype(parts) == act_variant(icand.BUILD_ACTIVATION, None) == "int8_gelu"
    pt = Point(37, signature=QSIG, family="scaled_mm", op="scaled_mm_quant", n=parts.n, k=parts.k)
    o = icand.operands(pt, "cpu", seed=1)
    ref = reference_scaled_mm_act_quant(o.acts["a"], o.weights[0]["w"], o.acts["sa"], o.consts["sw"], None,
                                        o.consts["out_scale"], icand.BUILD_ACTIVATION)
    plain = oasr_ops.scaled_mm_quant(o.acts["a"], o.weights[0]["w"], o.acts["sa"], o.consts["sw"],
                                     o.consts["out_scale"])
    assert not torch.equal(ref, plain)  # GELU changes the values: the check below can tell the two ops apart
    for cand in icand.candidates(parts, "sm90"):
        assert torch.equal(cand.bind(o, cand.id, 0)(), ref), cand.id
