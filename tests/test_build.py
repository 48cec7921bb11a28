"""oasr tune build's CPU-side logic: census merge, point planning, checkpoint/resume, publish; bench refusals."""
import json
from pathlib import Path

import pytest
import torch

from oasr_ops.tune import bench, database
from oasr_ops.tune.build import BuildOptions, SignatureWork, load_censuses, load_works, plan_points, run_build
from oasr_ops.tune.candidates import parts_of
from oasr_ops.tune.partition import partition_signature

SIG_A = "gemm|op=gemm|dt=half|N=512|K=256"
SIG_B = "gemm|op=gemm_activation|dt=half|N=1024|K=256"


def _census(path, sigs, weight_bytes=0):
    path.write_text(json.dumps({"weight_bytes": weight_bytes, "signatures": sigs}))
    return str(path)


def test_parse_signature():
    p = parts_of(SIG_B)
    assert (p.family, p.op, p.dt, p.n, p.k) == ("gemm", "gemm_activation", "half", 1024, 256)
    assert parts_of("scaled_mm|op=scaled_mm|N=1|K=2").dt is None
    with pytest.raises(ValueError, match="malformed"):
        parts_of("gemm|op=gemm|N=x|K=2")
    with pytest.raises(ValueError, match="malformed"):
        parts_of("gemm|op=gemm|N=8|K=2")  # a dtyped family's signature without dt


def test_censuses_merge(tmp_path):
    a = _census(tmp_path / "a.json", {SIG_A: {"points": [
        {"m": 64, "weight": 2.0, "calls": 10, "must_tune": False, "eager_fraction": 0.0},
        {"m": 128, "weight": 1.0, "calls": 10, "must_tune": True, "eager_fraction": 0.0}]}}, weight_bytes=10)
    b = _census(tmp_path / "b.json", {SIG_A: {"points": [
        {"m": 64, "weight": 1.0, "calls": 30, "must_tune": True, "eager_fraction": 1.0}]},
        "scaled_mm|op=scaled_mm|N=8|K=16": {"points": [{"m": 1}]}}, weight_bytes=99)
    works = load_censuses([a, b])
    assert list(works) == [SIG_A]  # other families are not this build's
    w = works[SIG_A]
    p64 = w.points[0]
    assert (p64.m, p64.weight, p64.calls, p64.must_tune) == (64, 3.0, 40, True)
    assert p64.eager_fraction == pytest.approx(30 / 40)
    assert w.weight_bytes == 99


def test_plan_points_thin_and_fill():
    pts = [dict(m=m, weight=1.0, calls=1, must_tune=(m == 96), eager_fraction=0.0) for m in range(8, 400, 8)]
    from oasr_ops.tune.points import Point
    work = SignatureWork(SIG_A, [Point(**p) for p in pts])
    planned = plan_points(work, thin=True, max_points=6, max_fill=2)
    census = [p for p in planned if not p.fill]
    assert len(census) <= 6 and census[0].m == 8 and census[-1].m == 392
    assert sum(p.weight for p in census) == pytest.approx(len(pts))  # dropped weight moved up, none lost
    assert any(p.must_tune for p in census)
    fills = [p for p in planned if p.fill]
    assert len(fills) <= 2 and all(p.weight < 0.1 for p in fills)


def _synthetic_measure(calls):
    def measure_one(work, points, opts, result):
        calls.append(work.signature)
        times = {p.m: {"torch": 10.0, "t64x64x64_c1x1_pp": 5.0 if p.m <= 128 else 12.0,
                       "t128x128x64_c2x1_coop": 20.0} for p in points}
        result.points_measured += len(points)
        return partition_signature(times, {p.m: p.weight for p in points}, fallback="torch").entry("aot")
    return measure_one


def test_run_build_checkpoints_and_resumes(tmp_path):
    c = _census(tmp_path / "c.json", {
        SIG_A: {"points": [{"m": 16, "weight": 1}, {"m": 128, "weight": 1}, {"m": 1000, "weight": 1}]},
        SIG_B: {"points": [{"m": 64, "weight": 1}, {"m": 4096, "weight": 1}]}})
    works = load_censuses([c])
    out = tmp_path / "db"
    opts = BuildOptions(out=str(out), checkpoint_dir=tmp_path / "ckpt", progress=False, max_fill=0)
    calls: list[str] = []
    res = run_build(works, opts, "sm90", "sm90_f16_wgmma", _synthetic_measure(calls))
    assert sorted(calls) == sorted([SIG_A, SIG_B]) and not res.resumed
    doc = json.loads((out / "sm90" / "gemm.json").read_text())
    assert doc["entries"][SIG_A]["regions"] == [[128, "t64x64x64_c1x1_pp"], [None, "torch"]]
    # interrupted after SIG_A: only SIG_B is measured again
    ckpts = sorted((tmp_path / "ckpt").glob("*.json"))
    assert len(ckpts) == 2
    for p in ckpts:
        if json.loads(p.read_text())["signature"] == SIG_B:
            p.unlink()
    calls.clear()
    res2 = run_build(works, opts, "sm90", "sm90_f16_wgmma", _synthetic_measure(calls))
    assert calls == [SIG_B] and res2.resumed == [SIG_A]
    assert set(res2.entries) == {SIG_A, SIG_B}


def test_bench_refuses_inside_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(bench.BenchError, match="capture"):
        bench.refuse_in_capture()
    with pytest.raises(bench.BenchError):
        bench.measure({"x": [lambda: None] * 8})


def test_bench_needs_eight_calls(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(bench.BenchError, match=">= 8"):
        bench.measure({"x": [lambda: None] * 4})


def test_copies_for_cold_and_warm(monkeypatch):
    monkeypatch.setattr(bench, "l2_bytes", lambda: 60 * 2**20)
    assert bench.copies_for(2**20, cold=False) == 1
    assert bench.copies_for(2**20, cold=True) == 120
    assert bench.copies_for(512 * 2**20, cold=True) == 1


def test_weights_cold_is_the_builds_rule(monkeypatch):
    monkeypatch.setattr(bench, "l2_bytes", lambda: 60 * 2**20)
    assert bench.weights_cold(0)  # unknown working set: cold
    assert not bench.weights_cold(26 * 2**20)  # a census model whose weights fit in L2
    assert bench.weights_cold(104 * 2**20)


def test_round_order_alternates_or_shuffles_reproducibly():
    import random

    keys = ["a", "b", "c"]
    rng = random.Random(0)
    orders = [bench.round_order(keys, i, rng, "alternate") for i in range(4)]
    assert orders == [keys, keys[::-1], keys, keys[::-1]]
    # every key is first as often as last over an even number of rounds
    assert sum(o[0] == "a" for o in orders) == sum(o[-1] == "a" for o in orders) == 2
    a = [bench.round_order(keys, i, random.Random(5), "shuffle") for i in range(3)]
    b = [bench.round_order(keys, i, random.Random(5), "shuffle") for i in range(3)]
    assert a == b and all(sorted(o) == keys for o in a)
    # the build's shuffle consumes the rng exactly as before the option existed (logs stay comparable)
    r1, r2 = random.Random(3), random.Random(3)
    ref = list(keys)
    r2.shuffle(ref)
    assert bench.round_order(keys, 0, r1, "shuffle") == ref
    with pytest.raises(ValueError, match="order"):
        bench.round_order(keys, 0, rng, "sideways")


def test_bench_rejects_an_unknown_order_before_timing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="order"):
        bench.measure({"x": [lambda: None] * 8}, order="sideways")


def test_fp8_census_bench_alternates_and_takes_per_shape_medians(monkeypatch):
    """benchmarks/scaled_mm_fp8.py's round logic (pure; a fake timer): each arm once per round, forward then
    reverse, the median over rounds; a drift that favours the later arm in a fixed order cancels."""
    import importlib.util
    import sys as _sys

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "scaled_mm_fp8.py"
    spec = importlib.util.spec_from_file_location("_fp8_census_bench", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(_sys, "path", list(_sys.path))  # the script puts the checkout first: not for later tests
    monkeypatch.setitem(_sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    seen: list[str] = []
    clock = {"t": 0}

    def timer(name: str) -> float:  # the GPU warms up: each timing is 1 % faster than the one before
        seen.append(name)
        clock["t"] += 1
        return {"torch": 10.0, "auto": 10.0}[name] * 0.99 ** clock["t"]

    med, per = mod.alternating_medians(["torch", "auto"], 4, timer)
    assert seen == ["torch", "auto", "auto", "torch"] * 2
    assert [len(v) for v in per.values()] == [4, 4]
    ratio = med["torch"] / med["auto"]
    assert abs(ratio - 1.0) < 0.005  # a fixed order would report 0.99x: torch always timed first
    fixed = {"torch": [], "auto": []}
    clock["t"] = 0
    for _ in range(4):
        for nm in ("torch", "auto"):
            fixed[nm].append(timer(nm))
    import statistics
    assert statistics.median(fixed["torch"]) / statistics.median(fixed["auto"]) > 1.009


def test_scaled_mm_points_come_from_quantizable_gemm_sites(tmp_path):
    c = _census(tmp_path / "c.json", {
        SIG_A: {"points": [{"m": 16, "weight": 1.0, "calls": 2, "must_tune": True}]},
        SIG_B: {"points": [{"m": 16, "weight": 2.0, "calls": 3}, {"m": 64, "weight": 1.0, "calls": 1}]},
        "gemm|op=gemm|dt=half|N=512|K=200": {"points": [{"m": 16}]},  # K % 16 != 0: stays fp16
    }, weight_bytes=1000)
    works = load_works([c], "scaled_mm")
    assert sorted(works) == ["scaled_mm|op=scaled_mm|N=1024|K=256", "scaled_mm|op=scaled_mm|N=512|K=256"]
    w = works["scaled_mm|op=scaled_mm|N=512|K=256"]
    assert [(p.m, p.weight, p.calls, p.must_tune) for p in w.points] == [(16, 1.0, 2, True)]
    assert w.weight_bytes == 500  # int8 weights are half the fp16 bytes


def test_entries_from_log_repartitions_and_returns_the_measurement_stamp(tmp_path):
    from oasr_ops.tune.build import entries_from_log

    stamp = {"impl": "i", "sku": "NVIDIA H200", "nvcc": "n", "cutlass": "c"}
    recs = [{"signature": SIG_A, "m": m, "config": c, "median_s": t, "sigma_s": 0.0, "n": 3, "weight": 1.0,
             "l2": "cold", "validators": stamp}
            for m, row in ((16, {"torch": 1.0, "B": 1.3}), (64, {"torch": 10.0, "B": 5.0})) for c, t in row.items()]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    entries, got = entries_from_log(log, BuildOptions(arch="sm90"))
    assert got == stamp
    assert entries[SIG_A]["regions"] == [[16, "torch"], [64, "B"], [None, "torch"]]  # the max_loss guard


@pytest.mark.parametrize("text", ['{"signature": "%s", "entry": 5}', '{"signature": "%s", "entry": {"x": 1}}',
                                  '{"signature": "%s", "entry": {"regions": "t64"}}', '[1, 2]', '{"sig',
                                  '{"signature": "another", "entry": {"regions": []}}'])
def test_a_damaged_checkpoint_is_measured_again(tmp_path, text):
    """`read_checkpoint` answers None (measure again) for a checkpoint that is not a finished entry, rather than
    handing the build something the DB's publish refuses after every other signature was measured."""
    from oasr_ops.tune.build import checkpoint_path, read_checkpoint, write_checkpoint

    sig = "gemm|op=gemm|dt=half|N=256|K=1024"
    write_checkpoint(tmp_path, sig, {"regions": [[None, "torch"]]})
    assert read_checkpoint(tmp_path, sig) == {"regions": [[None, "torch"]]}
    checkpoint_path(tmp_path, sig).write_text(text.replace("%s", sig))
    assert read_checkpoint(tmp_path, sig) is None
