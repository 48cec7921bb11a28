"""Selection: user ▸ system ▸ cost model ▸ default / heuristic, memo per epoch, counts, region tables."""
from __future__ import annotations

import json
import random
import warnings

import pytest

from oasr_ops.runtime.registry import native_lane
from oasr_ops.tune import database as db
from oasr_ops.runtime import select as sel
from oasr_ops.runtime import select_report as sel_report
from oasr_ops.runtime import validators as val

LANE = "sm90_f16_wgmma"
DEFAULT = native_lane("sm90").default.id
A, B, C, D = "t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop", "t64x128x64_c1x1_pp", "t128x256x64_c1x1_coop"
SIG = "gemm|op=gemm|dt=half|N=512|K=256"
A8, B8 = "t64x64x128_c1x1_pp", "t128x128x128_c1x1_coop"  # sm90_int8_wgmma tiles for the scaled_mm family


@pytest.fixture
def env(tuning_env):
    sel_report.reset_counts()
    yield tuning_env
    for fam in ("gemm", "scaled_mm"):
        sel.register_cost_model(fam, None)
        sel.register_fallback(fam, None)


@pytest.fixture
def model_off(env, monkeypatch):
    """The built-in cost-model tier off (OASR_TUNE_MODEL_FALLBACK=0, its documented switch): these tests' subject
    is the DB tiers and the family's policy, which the model tier (gemm/bmm are `modelled`) would otherwise answer
    for every uncovered shape. tests/test_model_tier.py tests the tier itself."""
    monkeypatch.setenv("OASR_TUNE_MODEL_FALLBACK", "0")
    db.reload()
    return env


def write_db(root, family, entries, *, arch="sm90", lane=LANE):
    doc = {"schema": 2, "kernel_family": family, "arch_family": arch, "lane": lane,
           "validators": val.current_soft_validators(lane), "configs": {}, "entries": entries}
    p = root / arch / f"{family}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    return p


def pick(m, dtype="fp16", n=512, k=256, op="gemm", family="gemm"):
    return sel.select_config(family, op, dtype, n, k, m)


def test_tiers_in_order(env, model_off):
    write_db(env.user, "gemm", {SIG: {"regions": [[128, C]]}})
    write_db(env.system, "gemm", {SIG: {"regions": [[1024, A]]}})
    db.reload()
    assert pick(100) == sel.Selection(C, "user", "gemm|op=gemm|dt=fp16|N=512|K=256")
    assert pick(1000).tier == "system" and pick(1000).config == A
    assert pick(5000) == sel.Selection(DEFAULT, "default", "gemm|op=gemm|dt=fp16|N=512|K=256")
    assert pick(5000, op="gemm_activation").tier == "default"
    assert pick(100, dtype="half").signature == SIG
    with pytest.raises(Exception):
        pick(1).config = "x"  # frozen


def test_cost_model_tier_and_switch(env, monkeypatch):
    write_db(env.system, "gemm", {SIG: {"regions": [[64, A]]}})
    seen = []

    def model(lane, m, n, k, dtype):
        seen.append((lane.name, m, n, k, dtype))
        return D if m > 1000 else None

    sel.register_cost_model("gemm", model)
    db.reload()
    assert pick(64) == sel.Selection(A, "system", pick(64).signature)
    assert pick(2000).config == D and pick(2000).tier == "model"
    assert pick(500).tier == "default"  # the model had no opinion
    assert seen == [(LANE, 2000, 512, 256, "fp16"), (LANE, 500, 512, 256, "fp16")]
    assert sel.region_table("gemm", "gemm", "fp16", 512, 256) == [[64, A], [None, "auto"]]
    monkeypatch.setenv("OASR_TUNE_MODEL_FALLBACK", "0")
    assert pick(2000).tier == "model"  # unchanged until reload
    db.reload()
    assert pick(2000) == sel.Selection(DEFAULT, "default", pick(2000).signature)
    assert sel.region_table("gemm", "gemm", "fp16", 512, 256) == [[64, A], [None, DEFAULT]]


def test_bad_cost_model_is_skipped(env):
    sel.register_cost_model("gemm", lambda *a: "../../x;rm -rf")
    db.reload()
    with pytest.warns(db.TuningDBWarning, match="cost model"):
        assert pick(1).tier == "default"
    sel.register_cost_model("gemm", lambda *a: 1 / 0)
    db.reload()
    with pytest.warns(db.TuningDBWarning, match="raised"):
        assert pick(1).tier == "default"


def test_heuristic_off_uses_lane_default(env, monkeypatch):
    write_db(env.user, "gemm", {SIG: {"regions": [[None, C]]}})
    sel.register_cost_model("gemm", lambda *a: D)
    monkeypatch.setenv("OASR_GEMM_HEURISTIC", "0")
    db.reload()
    for m in (1, 100, 10**6):
        s = pick(m)
        assert (s.config, s.tier) == (DEFAULT, "default")
    assert sel.region_table("gemm", "gemm", "fp16", 512, 256) == [[None, DEFAULT]]


def test_scaled_mm_heuristic_fallback(env):
    sig = "scaled_mm|op=scaled_mm|N=768|K=256"
    write_db(env.system, "scaled_mm", {sig: {"regions": [[7136, "heuristic"], [None, B8]]}}, lane="sm90_int8_wgmma")
    db.reload()
    s = sel.select_config("scaled_mm", "scaled_mm", "int8", 768, 256, 10)
    assert s == sel.Selection("heuristic", "system", sig)
    assert sel.select_config("scaled_mm", "scaled_mm", "int8", 768, 256, 8000).config == B8
    assert sel.select_config("scaled_mm", "scaled_mm", "int8", 64, 64, 8000) == \
        sel.Selection("heuristic", "heuristic", "scaled_mm|op=scaled_mm|N=64|K=64")
    sel.register_fallback("scaled_mm", lambda lane, m, n, k, dt: A8 if m < 100 else "bogus")
    db.reload()
    assert sel.select_config("scaled_mm", "scaled_mm_quant", "int8", 64, 64, 8) == \
        sel.Selection(A8, "heuristic", "scaled_mm|op=scaled_mm_quant|N=64|K=64")
    with pytest.warns(db.TuningDBWarning, match="fallback"):
        assert sel.select_config("scaled_mm", "scaled_mm_quant", "int8", 64, 64, 800).config == "heuristic"


def test_no_gpu_no_arch_is_default(env, monkeypatch):
    monkeypatch.delenv("OASR_ARCH")
    db.reload()
    s = pick(7)
    assert (s.config, s.tier) == ("default", "default") and s.signature == "gemm|op=gemm|dt=fp16|N=512|K=256"
    assert sel.region_table("gemm", "gemm", "fp16", 512, 256) == [[None, "default"]]
    assert sel.select_config("scaled_mm", "scaled_mm", "int8", 8, 8, 8).tier == "default"


def test_arch_without_lane(env, model_off):
    assert sel.select_config("gemm", "gemm", "fp16", 512, 256, 1, arch="sm70") == \
        sel.Selection("default", "default", "gemm|op=gemm|dt=fp16|N=512|K=256")
    assert pick(1, family="gemm").config == DEFAULT
    sm80 = native_lane("sm80").default.id
    assert sel.select_config("gemm", "gemm", "fp16", 512, 256, 1, arch="8.0").config == sm80


def test_infeasible_db_config_falls_through(env, model_off):
    write_db(env.system, "gemm", {"gemm|op=gemm|dt=half|N=516|K=256": {"regions": [[None, A]]}})
    db.reload()
    with pytest.warns(db.TuningDBWarning, match="cannot serve"):
        assert pick(1, n=516).tier == "default"


def test_memo_and_epochs(env, monkeypatch):
    p = write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    db.reload()
    first = pick(10)
    assert first.config == A
    write_db(env.system, "gemm", {SIG: {"regions": [[None, B]]}})

    def boom(*a, **k):
        raise AssertionError("a memoised hit must not touch the database")

    original = db.chain
    monkeypatch.setattr(db, "chain", boom)
    assert pick(10) is first  # the same object: one dict access
    monkeypatch.setattr(db, "chain", original)
    assert pick(10) is first
    db.reload()
    assert pick(10).config == B
    assert p.exists()


def test_counts_per_call(env, model_off):
    write_db(env.system, "gemm", {SIG: {"regions": [[100, A]]}})
    db.reload()
    for _ in range(5):
        pick(50)
    pick(500)
    pick(500, op="gemm_activation")
    sel.select_config("scaled_mm", "scaled_mm", "int8", 8, 8, 8)
    rep = sel_report.tuning_report()
    assert rep["gemm"]["gemm"] == {"system": 5, "default": 1}
    assert rep["gemm"]["gemm_activation"] == {"default": 1}
    assert rep["scaled_mm"]["scaled_mm"] == {"heuristic": 1}
    db.reload()  # counts survive a new epoch
    pick(50)
    assert sel_report.tuning_report()["gemm"]["gemm"] == {"system": 6, "default": 1}
    text = sel_report.tuning_report(print_=True)
    assert "gemm/gemm: system=6 (2) default=1 (1)" in text


def test_select_conv1d(env):
    # the depthwise lane's ids (families/conv1d); an untuned shape gets the lane default (policy "default")
    dw_a, dw_c, dw_default = "dw32x64_v8_n256", "dw64x32_v16_n128", native_lane("sm90", "conv1d").default.id
    sig = "conv1d|op=conv1d|dt=half|N=384|K=31"
    write_db(env.system, "conv1d", {sig: {"points": {"1x3000": dw_a}, "regions": [[2000, dw_c]]}},
             lane="sm80_f16_dwconv")
    db.reload()
    assert sel.select_conv1d("conv1d", "fp16", 384, 31, 1, 3000, t_out=1500) == sel.Selection(
        dw_a, "system", "conv1d|op=conv1d|dt=fp16|N=384|K=31")
    assert sel.select_conv1d("conv1d", "fp16", 384, 31, 1, 2000, t_out=1000).config == dw_c
    assert sel.select_conv1d("conv1d", "fp16", 384, 31, 2, 3000, t_out=1500) == sel.Selection(
        dw_default, "default", "conv1d|op=conv1d|dt=fp16|N=384|K=31")


def test_bad_arguments_raise(env):
    with pytest.raises(ValueError):
        sel.select_config("gemm", "bmm", "fp16", 8, 8, 8)
    with pytest.raises(ValueError):
        sel.select_config("gemm", "gemm", "complex64", 8, 8, 8)


def test_resolve_in_table():
    t = [[16, "a"], [256, "b"], [None, "c"]]
    assert [sel.resolve_in_table(t, m) for m in (1, 16, 17, 256, 257)] == ["a", "a", "b", "b", "c"]
    assert sel.resolve_in_table([[8, "a"]], 9) == "auto"


def _random_regions(rng, catch_all):
    ms = sorted(rng.sample(range(1, 4096), rng.randint(0, 4)))
    ids = [A, B, C, D, "torch", "default", "not-an-id"]
    regs = [[m, rng.choice(ids)] for m in ms]
    if catch_all:
        regs.append([None, rng.choice(ids)])
    return regs


@pytest.mark.parametrize("seed", range(12))
def test_region_table_agrees_with_select(env, seed):
    rng = random.Random(seed)
    for root in (env.user, env.system):
        entries = {}
        for dt in ("half", "fp16", "bf16"):
            if rng.random() < 0.7:
                entries[f"gemm|op=gemm|dt={dt}|N=512|K=256"] = {
                    "regions": _random_regions(rng, catch_all=(root == env.system and rng.random() < 0.5))}
        write_db(root, "gemm", entries)
    db.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in ("fp16", "bf16", "half"):
            table = sel.region_table("gemm", "gemm", dtype, 512, 256)
            assert table[-1][0] is None
            bps = [m for m, _ in table[:-1]]
            assert bps == sorted(set(bps))
            for m in list(range(1, 40)) + [rng.randint(1, 6000) for _ in range(150)]:
                assert sel.resolve_in_table(table, m) == sel.select_config("gemm", "gemm", dtype, 512, 256, m).config
