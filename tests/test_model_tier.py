"""The built-in cost-model tier (runtime/model_tier.py) as the selector uses it, on the CPU.

Arch sm90 by name (no GPU needed: the tier ranks against the arch's reference profile), the test's own empty DB
(tuning_env: user and system tiers under tmp_path). What is checked: an uncovered shape of a `modelled` family is
answered by the tier (tier "model"), small shapes get cuBLAS, the answer is deterministic and is
`model_tier.choose`'s, the switch turns it off, a DB entry still wins, a baked region table agrees with
`select_config` at and between the tier's rungs, an unmodelled family never sees it, the report counts it, and a
broken model section of ours is warned about once and skipped while another tool's is ignored silently. Where
it matters, both the structure alone (empty DB) and the shipped calibration (db/sm90/gemm.json's model section,
copied into the test's user tier) are exercised.
"""
from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.runtime import cost_model, model_tier, registry
from oasr_ops.runtime import select as sel
from oasr_ops.runtime import select_report as sel_report
from oasr_ops.runtime import validators as val
from oasr_ops.tune import database as db

LANE = registry.native_lane("sm90", "gemm")
DEFAULT = LANE.default.id
A, B = "t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop"
# (N, K) where the uncalibrated model (the structure alone, no DB) answers CUTLASS at small M and cuBLAS above
# (checked in test_uncovered_shape_is_answered_by_the_model)
BIG = (8192, 8192)
SMALL = [(256, 256), (512, 256), (1024, 256), (256, 1024)]
SHIPPED = Path(__file__).resolve().parents[1] / "db" / "sm90" / "gemm.json"


@pytest.fixture
def env(tuning_env):
    sel_report.reset_counts()
    yield tuning_env
    sel_report.reset_counts()


def shipped_model() -> dict:
    """The calibrated model section the repository ships for sm90 gemm (a valid section of ours)."""
    model = json.loads(SHIPPED.read_text()).get("model") if SHIPPED.exists() else None
    if not isinstance(model, dict) or model.get("kind") != cost_model.MODEL_KIND:
        pytest.skip("no shipped sm90 gemm cost-model section")
    return model


@pytest.fixture(params=["uncalibrated", "calibrated"])
def model_env(request, env):
    """The tier with the structure alone (empty DB) or with the shipped calibration in the user tier's file."""
    if request.param == "calibrated":
        write_db(env.user, {}, model=shipped_model())
        db.reload()
    return env


def write_db(root, entries, *, model=None, family="gemm", lane="sm90_f16_wgmma"):
    doc = {"schema": 2, "kernel_family": family, "arch_family": "sm90", "lane": lane,
           "validators": val.current_soft_validators(lane), "configs": {}, "entries": entries}
    if model is not None:
        doc["model"] = model
    p = root / "sm90" / f"{family}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    return p


def pick(m, n=BIG[0], k=BIG[1], dtype="fp16", op="gemm", family="gemm", arch=None):
    return sel.select_config(family, op, dtype, n, k, m, arch=arch)


def sample_ms(seed=0):
    """Every rung, its neighbours, a dense low range and random Ms up to 20000 (the tier is a step function)."""
    rng = random.Random(seed)
    ms = set(range(1, 1100))
    for r in model_tier.RUNGS:
        ms |= {r - 1, r, r + 1}
    ms |= {rng.randint(1, 20000) for _ in range(300)}
    return sorted(m for m in ms if m >= 1)


MS = (8, 100, 1000, 4096, 65536, 10**6)


def test_uncovered_shape_is_answered_by_the_model(env):
    for m in MS:
        assert pick(m).tier == "model"
    # the tier really chooses: CUTLASS configs of the native lane at some Ms, cuBLAS at others
    answers = {pick(m).config for m in MS}
    assert "torch" in answers and answers - {"torch"}
    for c in answers - {"torch"}:
        LANE.get(c)  # ConfigError if the tier answered something outside the native lane


def test_calibrated_model_answers_every_uncovered_shape(model_env):
    for n, k in [BIG, (4096, 4096), (1024, 256)]:
        for m in MS:
            s = pick(m, n, k)
            assert s.tier == "model"
            if s.config != "torch":
                LANE.get(s.config)


def test_arch_by_argument(env, monkeypatch):
    monkeypatch.delenv("OASR_ARCH")
    db.reload()
    s = pick(1000, arch="sm90")
    assert s.tier == "model"
    assert s.config == model_tier.choose("gemm", "gemm", LANE, 1000, *BIG, "fp16", "sm90")
    assert pick(1000).tier == "default"  # no arch known on a CPU: no lane, no model


@pytest.mark.parametrize("n,k", SMALL)
def test_small_shapes_answer_torch(env, n, k):
    for m in (1, 8, 100, 1000):
        assert (pick(m, n, k).config, pick(m, n, k).tier) == ("torch", "model"), (m, n, k)


def test_bmm_is_modelled_too(env):
    s = sel.select_config("bmm", "bmm_nn", "fp16", 64, 256, 2048)
    assert (s.config, s.tier) == ("torch", "model")
    bmm_lane = registry.native_lane("sm90", "bmm")
    assert s.config == model_tier.choose("bmm", "bmm_nn", bmm_lane, 2048, 64, 256, "fp16", "sm90")


@pytest.mark.parametrize("n,k", [BIG, (4096, 4096), (12288, 4096), (1024, 256)])
def test_deterministic_and_equal_to_choose(model_env, n, k):
    for m in (1, 60, 100, 1000, 5000, 65536, 300000):
        first = pick(m, n, k)
        assert pick(m, n, k) is first  # memoised
        assert first.tier == "model"
        assert first.config == model_tier.choose("gemm", "gemm", LANE, m, n, k, "fp16", "sm90")
        db.reload()  # a new epoch resolves afresh: the same answer
        assert pick(m, n, k) == first


def test_switch_off_gives_the_lane_default(env, monkeypatch):
    assert pick(1000).tier == "model"
    monkeypatch.setenv("OASR_TUNE_MODEL_FALLBACK", "0")
    db.reload()
    for m in (1, 1000, 65536):
        assert (pick(m).config, pick(m).tier) == (DEFAULT, "default")
    assert sel.region_table("gemm", "gemm", "fp16", *BIG) == [[None, DEFAULT]]
    s = sel.select_config("bmm", "bmm_nn", "fp16", 64, 256, 2048)
    assert (s.config, s.tier) == ("torch", "default")  # bmm's policy


def test_db_entry_wins_over_the_model(env):
    sig = f"gemm|op=gemm|dt=half|N={BIG[0]}|K={BIG[1]}"
    write_db(env.user, {sig: {"regions": [[2048, A]]}})
    write_db(env.system, {sig: {"regions": [[8192, B]]}})
    db.reload()
    for m, cfg, tier in ((1000, A, "user"), (2048, A, "user"), (4096, B, "system"), (8192, B, "system")):
        s = pick(m)
        assert (s.config, s.tier) == (cfg, tier), m
        assert model_tier.choose("gemm", "gemm", LANE, m, *BIG, "fp16", "sm90") != cfg  # the DB really overrode
    assert pick(8193).tier == "model"  # above every entry: the model again


@pytest.mark.parametrize("n,k,entries", [
    (*BIG, None),
    (4096, 4096, None),
    (12288, 4096, None),
    (*BIG, [[100, A]]),                        # a system entry over the low Ms only: the model above 100
    (*BIG, [[40, "torch"], [5000, B]]),        # a sentinel region, then a tile, then the model above 5000
])
def test_region_table_agrees_with_select(model_env, n, k, entries):
    if entries is not None:
        write_db(model_env.system, {f"gemm|op=gemm|dt=half|N={n}|K={k}": {"regions": entries}})
        db.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid DB and a working model: nothing to warn about
        table = sel.region_table("gemm", "gemm", "fp16", n, k)
        assert table[-1][0] is None and "auto" not in [c for _, c in table]  # the model is baked, not "auto"
        bps = [m for m, _ in table[:-1]]
        assert bps == sorted(set(bps))
        for m in sample_ms(n + k):
            assert sel.resolve_in_table(table, m) == pick(m, n, k).config, m


def test_baked_table_is_reported_under_the_tier_that_answers_it(model_env, monkeypatch):
    """A symbolic-M site's baked table is labelled like `select_config` labels its Ms (the tuning report counts
    these labels): the model for an uncovered modelled signature (it said "default" before), the DB tier with an
    entry, the family's fallback tier with the model off or for a family the model does not serve."""
    from oasr_ops.families.graph import bake

    assert bake("gemm", "gemm", "fp16", *BIG, None, None)[1] == "model" == pick(5000).tier
    write_db(model_env.system, {f"gemm|op=gemm|dt=half|N={BIG[0]}|K={BIG[1]}": {"regions": [[100, A]]}})
    db.reload()
    assert bake("gemm", "gemm", "fp16", *BIG, None, None)[1] == "system"
    assert bake("scaled_mm", "scaled_mm", "int8", *BIG, None, None)[1] == "heuristic"
    monkeypatch.setenv("OASR_TUNE_MODEL_FALLBACK", "0")
    db.reload()
    assert bake("gemm", "gemm", "fp16", 4096, 4096, None, None)[1] == "default"
    assert sel.table_tier("gemm", "gemm", "fp16", 4096, 4096, "sm90") == "default"


@pytest.mark.slow
def test_region_table_agrees_at_every_m_up_to_20000(model_env):
    for n, k in (BIG, (4096, 4096)):
        table = sel.region_table("gemm", "gemm", "fp16", n, k)
        for m in range(1, 20001):
            assert sel.resolve_in_table(table, m) == pick(m, n, k).config, (n, k, m)


def test_unmodelled_family_never_gets_the_model_tier(env):
    assert registry.get("scaled_mm").modelled is False and registry.get("gemm").modelled is True
    for n, k in [(256, 256), (4096, 4096), (8192, 8192)]:
        for m in (1, 1000, 65536, 10**6):
            for op in ("scaled_mm", "scaled_mm_quant"):
                s = sel.select_config("scaled_mm", op, "int8", n, k, m)
                assert s.tier != "model" and s.tier == "heuristic", (op, n, k, m, s)
            assert sel.select_conv1d("conv1d", "fp16", n, 31, 1, m).tier == "default"


def test_report_counts_the_model_tier(env):
    for _ in range(3):
        pick(1000)
    pick(70000)
    pick(100, 512, 256)
    rep = sel_report.tuning_report()
    assert rep["gemm"]["gemm"] == {"model": 5}
    text = sel_report.tuning_report(print_=True)
    assert "gemm/gemm: model=5 (3)" in text  # 3 distinct shapes resolved


def test_malformed_model_section_of_ours_warns_once_and_is_skipped(env):
    bad = {"kind": cost_model.MODEL_KIND, "version": 1, "arch_family": "sm90", "configs": {A: "garbage"},
           "structure": [1, 2]}
    write_db(env.user, {}, model=bad)
    db.reload()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [pick(m) for m in (1, 1000, 65536)] + [pick(1000, 8192, 8192)]
        table = sel.region_table("gemm", "gemm", "fp16", *BIG)
    assert all((s.config, s.tier) == (DEFAULT, "default") for s in got)  # the tier stepped aside: the policy
    assert table == [[None, DEFAULT]]
    msgs = [str(x.message) for x in w if issubclass(x.category, db.TuningDBWarning)]
    assert len([m for m in msgs if "cost model" in m]) == 1, msgs


def test_another_tools_model_section_is_ignored_silently(env):
    write_db(env.user, {}, model={"alpha": 1.0})
    db.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = pick(1000)
    assert s.tier == "model"
    assert s.config == model_tier.choose("gemm", "gemm", LANE, 1000, *BIG, "fp16", "sm90")


def _brute_worst(cfg_id: str, lo: int, hi: int, n: int, k: int, act: bool) -> float:
    """min over every M in (lo, hi] of predicted T_torch / T_cfg, by brute force over each tile-row step."""
    from oasr_ops.configs import parse
    from oasr_ops.runtime import arch_profile
    cfg, prof = parse(cfg_id), arch_profile.reference_profile("sm90")
    step = cfg.tile[0] * cfg.cluster[0]
    ms = sorted({lo + 1, hi, *range((lo // step + 1) * step + 1, hi + 1, step)})
    return min(cost_model.predict_s("torch", m, n, k, "fp16", prof, activation=act)
               / cost_model.predict_s(cfg, m, n, k, "fp16", prof, activation=act) for m in ms if lo < m <= hi)


@pytest.mark.parametrize("n,k", [(768, 3072), (3072, 768), (640, 640), (896, 896), (1664, 1664), (4096, 1024)])
@pytest.mark.parametrize("op", ["gemm", "gemm_activation"])
def test_a_cutlass_answer_holds_over_its_whole_rung_interval(env, n, k, op):
    # the tier answers one config per rung interval; that config must not be predicted to lose anywhere in it
    # (the measured failure: a 256x128 tile, wave-aligned at the rung M=16384, served M=12000 at 0.95x cuBLAS)
    answered = 0
    for hi in (1024, 2048, 4096, 8192, 16384, 32768):
        lo = model_tier.RUNGS[model_tier.RUNGS.index(hi) - 1]
        got = {sel.select_config("gemm", op, "fp16", n, k, m, "sm90").config for m in (lo + 1, (lo + hi) // 2, hi)}
        assert len(got) == 1, (hi, got)  # one answer per rung
        cfg = got.pop()
        if cfg != "torch":
            answered += 1
            assert _brute_worst(cfg, lo, hi, n, k, op == "gemm_activation") >= 1.0 - 1e-9, (hi, cfg)
    if (n, k, op) == (4096, 1024, "gemm_activation"):
        assert answered  # the rule still lets CUTLASS answer where it is predicted to win throughout


def test_probe_ms_finds_the_worst_wave_edge():
    from oasr_ops.configs import parse
    from oasr_ops.runtime import arch_profile
    prof = arch_profile.reference_profile("sm90")
    for cid in ("t128x128x64_c1x1_pp", "t256x128x64_c2x1_coop", "t64x64x64_c2x1_pp"):
        cfg = parse(cid)
        for n in (512, 768, 1024, 3072):
            probes = cost_model.probe_ms(cfg, 4096, 16384, n, "fp16", prof)
            waves = {m: cost_model.structure(cfg, m, n, 1024, "fp16", prof).waves for m in probes}
            # every probe past a wave edge starts a new wave: one row fewer runs one wave fewer
            for m in probes[1:-1]:
                assert cost_model.structure(cfg, m - 1, n, 1024, "fp16", prof).waves == waves[m] - 1, (cid, n, m)
