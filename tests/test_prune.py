"""Cost-model pruning in the build (issue 11, item 4): the kept set, cross-evaluation, the log, the written model
section, and the regret report on a synthetic log. Fake measurements; no GPU, no timing asserted."""
import json
import math

import pytest

from oasr_ops.runtime import cost_model, registry
from oasr_ops.runtime.arch_profile import reference_profile
from oasr_ops.tune import build as build_mod
from oasr_ops.tune.candidates import candidates_for, parts_of
from oasr_ops.tune.points import Point, point_of
from oasr_ops.tune.prune import collect_table, forced_ids, keep_ids, pruning_regret

SIG = "gemm|op=gemm|dt=half|N=1024|K=1024"


def _lane():
    return registry.native_lane("sm90", "gemm")


def test_keep_ids_is_the_top_k_plus_the_forced_set():
    cands = candidates_for(parts_of(SIG), "sm90")
    ids = [c.id for c in cands]
    lane = _lane()
    forced = forced_ids(cands, lane.default.id)
    assert {"torch", "fused", lane.default.id} <= forced
    p = point_of(SIG, 300)
    kept = keep_ids(ids, p, forced, [None], top_k=4)
    priced = [c for c in ids if c not in forced]
    top = [c for c, _ in cost_model.rank(priced, 300, 1024, 1024, "fp16", reference_profile("sm90"))[:4]]
    assert set(kept) == {"torch", lane.default.id, *top}
    assert kept == [c for c in ids if c in kept]  # candidates' order
    assert len(kept) < len(ids)
    # a second model widens the union, never narrows it
    cal = cost_model.Calibration("sm90", configs={top[-1]: (1.0, 1.0, 1.0)}, structure=(1.0, 0.5, 0.0))
    assert set(kept) <= set(keep_ids(ids, p, forced, [None, cal], top_k=4))
    # everything kept: top_k <= 0, a k above the priced count, a family the model does not price (int8)
    assert keep_ids(ids, p, forced, [None], top_k=0) == ids
    assert keep_ids(ids, p, forced, [None], top_k=len(ids)) == ids
    int8 = Point(300, dtype="half", n=1024, k=1024)
    assert keep_ids(ids, Point(300, dtype="int8", n=1024, k=1024), forced, [None], top_k=2) == ids
    assert len(keep_ids(ids, int8, forced, [None], top_k=2)) == 4


def test_collect_table_cross_evaluates_top3_and_the_fallback():
    pts = [Point(m) for m in (16, 64, 256)]
    speed = {"A": {16: 1, 64: 5, 256: 9}, "B": {16: 5, 64: 1, 256: 9}, "C": {16: 9, 64: 9, 256: 1},
             "D": {16: 2, 64: 2, 256: 2}, "torch": {16: 3, 64: 3, 256: 3}}
    first = {16: ["A", "D", "torch"], 64: ["B", "torch"], 256: ["C", "torch"]}
    asked = []

    def measure(p, ids):
        asked.append((p.m, tuple(ids)))
        return {c: float(speed[c][p.m]) for c in ids if c != "X"}

    t = collect_table(pts, lambda p: first[p.m], measure, fallback="torch",
                      feasible=lambda p, c: not (c == "C" and p.m == 16))
    # every point's top-3 is measured at every other point where feasible; C cannot run at 16
    for m in (16, 64, 256):
        assert {"A", "B", "torch"} <= set(t[m])
    assert "C" not in t[16] and "C" in t[64] and "D" in t[256]
    # nothing is asked twice at a point, and the loop ends
    seen = [(m, c) for m, ids in asked for c in ids]
    assert len(seen) == len(set(seen))


@pytest.fixture
def fake_bench(monkeypatch):
    """bench.measure reports a deterministic synthetic time per (arm, M) without running the op."""
    from oasr_ops.tune import bench
    from oasr_ops.tune.stats import Estimate

    timed: list[tuple[int, str]] = []

    def measure(arms, *, rounds=7, seed=0, eager=frozenset(), env=None):
        out = {}
        for name, calls in arms.items():
            m = calls[0].__closure__ and _m_of(calls[0])
            timed.append((m, name))
            t = _synthetic_s(name, m)
            out[name] = bench.ArmResult(Estimate(t, 0.0, rounds), [t] * rounds)
        return out

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "l2_bytes", lambda: 32 * 1024)
    monkeypatch.setattr(bench, "host_overhead_us", lambda fn, iters=2000: 2.0)
    return timed


def _m_of(call):
    for cell in call.__closure__:
        v = cell.cell_contents
        if hasattr(v, "shape") and len(v.shape) == 2 and v.shape[1] == 64 and v.shape[0] != 64:
            return int(v.shape[0])
    return int(next(c.cell_contents.shape[0] for c in call.__closure__ if hasattr(c.cell_contents, "shape")))


def _synthetic_s(name, m):
    # the model's ranking is irrelevant here: times depend on the name only, plus a torch that wins at large M
    if name == "torch":
        return 5e-6 if m > 64 else 9e-6
    return 6e-6 + (sum(map(ord, name)) % 37) * 1e-8


def test_build_measures_only_kept_arms_logs_the_pruned_ones_and_writes_the_model(tmp_path, fake_bench, monkeypatch):
    monkeypatch.setattr(build_mod, "host_costs", lambda *a, **k: {"torch": 2.0, "oasr": 2.0})
    sig = "gemm|op=gemm|dt=half|N=64|K=64"
    census = tmp_path / "c.json"
    census.write_text(json.dumps({"signatures": {sig: {"points": [{"m": 16, "weight": 1.0}, {"m": 200, "weight": 1.0}]}}}))
    common = dict(family="gemm", arch="sm90", device="cpu", max_fill=0, rounds=3, progress=False, validate=False)
    opts = build_mod.BuildOptions(out=str(tmp_path / "db"), log=tmp_path / "log.jsonl", top_k=3, **common)
    res = build_mod.build([str(census)], opts)
    cands = candidates_for(parts_of(sig), "sm90")
    plan = build_mod.arm_plan(sig, [Point(16), Point(200)], opts, "sm90", cands=cands)
    first = {(m, c) for m, ids in plan.items() for c in ids}
    timed = set(fake_bench)
    assert first <= timed  # every kept arm was measured ...
    assert len(timed) < 2 * len([c for c in cands])  # ... and not everything was
    assert res.arms_pruned > 0
    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert all("config" in r and "median_s" in r for r in recs)  # every line is still one measurement
    pruned = {r["m"]: r["pruned"] for r in recs if "pruned" in r}
    assert set(pruned) == {16, 200}
    for m, ids in pruned.items():
        assert ids and not set(ids) & set(plan[m])
        assert "torch" not in ids and _lane().default.id not in ids  # the forced set is never pruned
    # the file carries the model fitted on the log, and --from-log writes the same entries and model
    doc = json.loads((tmp_path / "db" / "sm90" / "gemm.json").read_text())
    assert res.model and cost_model.from_json(doc["model"]).arch_family == "sm90"
    again, _ = build_mod.entries_from_log(tmp_path / "log.jsonl", build_mod.BuildOptions(arch="sm90"))
    assert again == doc["entries"]
    assert build_mod.model_from_log(tmp_path / "log.jsonl", "gemm", "sm90") == doc["model"]
    # --no-prune measures every feasible arm at every point
    fake_bench.clear()
    full = build_mod.BuildOptions(out=str(tmp_path / "db2"), log=tmp_path / "log2.jsonl", prune=False, **common)
    res2 = build_mod.build([str(census)], full)
    assert res2.arms_pruned == 0 and len(set(fake_bench)) == 2 * len(cands)
    assert not any("pruned" in json.loads(line) for line in (tmp_path / "log2.jsonl").read_text().splitlines())


def _log(sig, rows, weight=1.0):
    return [{"signature": sig, "m": m, "config": c, "median_s": t, "weight": weight} for m, row in rows.items()
            for c, t in row.items()]


def test_pruning_regret_report_on_a_synthetic_log():
    lane = _lane()
    ids = [c.id for c in lane.space]
    prof = reference_profile("sm90")

    def t(c, m):  # the structure's own prediction, except the model's last-ranked config wins at M=512
        rank = [x for x, _ in cost_model.rank(ids, m, 1024, 1024, "fp16", prof)]
        if m == 512 and c == rank[-1]:
            return 1e-6
        return cost_model.predict_s(c, m, 1024, 1024, "fp16", prof)

    rows = {m: {**{c: t(c, m) for c in ids}, "torch": 50e-6} for m in (64, 512, 4096)}
    recs = _log(SIG, rows)
    r16 = pruning_regret(recs, "sm90", top_k=16)
    r2 = pruning_regret(recs, "sm90", top_k=2)
    assert r16["arms_pruned"] <= r16["arms_full"] == len(recs)
    assert r2["arms_pruned"] < r16["arms_pruned"]
    # the full build finds the outlier at 512; the top-2 pruned one cannot, so it is slower there
    assert r2["vs_full"]["max"] > 0 and r2["vs_full"]["worse_points"] >= 1
    assert r2["pruned"]["geomean"] >= r2["full"]["geomean"]
    assert math.isclose(r16["full"]["geomean"], r2["full"]["geomean"])


def test_int8_tiles_are_not_modelled():
    sig = "scaled_mm|op=scaled_mm|N=1024|K=1024"
    cands = candidates_for(parts_of(sig), "sm90")
    ids = [c.id for c in cands]
    p = Point(300, family="scaled_mm", dtype="half", n=1024, k=1024)
    assert keep_ids(ids, p, forced_ids(cands, None), [None], top_k=2) == ids
