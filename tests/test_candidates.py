"""The candidate interface on the CPU: every family's factory through the registry, operands and their reference,
the numeric gates, and the generic build / prewarm measuring paths end to end with the ops' CPU reference
running inside each candidate's make_call (only bench.measure's GPU timing is replaced by synthetic times)."""
import json
import zlib

import pytest
import torch

from oasr_ops.families.gemm.ops import reference_gemm
from oasr_ops.runtime import registry
from oasr_ops.tune import bench, build as build_mod, prewarm
from oasr_ops.tune.candidates import (Candidate, Gate, candidates_for, fallback_id, gate_candidates, operands_for,
                                      parts_of, pseudo_arms, tunable_families)
from oasr_ops.tune.points import point_of
from oasr_ops.tune.stats import Estimate

GEMM = "gemm|op=gemm_activation|dt=half|N=64|K=64"
SMM = "scaled_mm|op=scaled_mm|N=64|K=64"
FAST = "t64x64x64_c1x1_pp"  # the synthetic winner of the gemm lane


def _synthetic_s(name: str, m: int) -> float:
    """A deterministic per-(arm, M) time: FAST wins where M <= 32, torch elsewhere."""
    if name == FAST:
        return 1e-6 if m <= 32 else 9e-6
    if name == "torch":
        return 5e-6
    return 6e-6 + (zlib.crc32(name.encode()) % 100) * 1e-8


@pytest.fixture
def fake_bench(monkeypatch):
    """bench.measure runs every arm's calls (the op's CPU path) and reports synthetic times."""
    ran: dict[str, int] = {}

    def measure(arms, *, rounds=7, seed=0, eager=frozenset(), env=None):
        out = {}
        for name, calls in arms.items():
            assert len(calls) >= bench.MIN_CALLS
            results = [c() for c in calls]
            assert all(isinstance(r, torch.Tensor) for r in results)
            ran[name] = ran.get(name, 0) + len(calls)
            m = int(results[0].reshape(-1, results[0].shape[-1]).shape[0])
            t = _synthetic_s(name, m)
            out[name] = bench.ArmResult(Estimate(t, 0.0, rounds), [t] * rounds)
        return out

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "l2_bytes", lambda: 32 * 1024)
    monkeypatch.setattr(bench, "host_overhead_us", lambda fn, iters=2000: (fn(), 2.0)[1])
    return ran


def test_every_measurable_family_supplies_candidates_and_operands():
    assert tunable_families()[:3] == ["gemm", "scaled_mm", "bmm"]
    for sig in (GEMM, SMM, "bmm|op=bmm_nn|dt=half|N=64|K=64", "bmm|op=bmm|dt=half|N=64|K=64"):
        cands = candidates_for(parts_of(sig), "sm90")
        ids = [c.id for c in cands]
        assert len(ids) == len(set(ids)) > 2, sig
        assert sum(c.fallback for c in cands) == 1
        baselines = {c.gate.baseline for c in cands}
        assert baselines <= set(ids)  # every gate compares with a candidate of the same set
        p = point_of(sig, 24, "bf16")
        ops = operands_for(p, "cpu", seed=3)
        again = operands_for(p, "cpu", seed=3)
        assert all(torch.equal(x, y) for x, y in zip(ops.acts.values(), again.acts.values()))  # seeded
        for c in cands:
            out = c.make_call(ops)()
            assert out.shape[-2:] == (24, 64), (sig, c.id)
    # every registered family has a factory now (conv1d's: tests/test_conv1d_tuning.py, fp8's:
    # tests/test_scaled_mm_fp8.py)
    assert set(tunable_families()) == set(registry.families())


def test_gemm_candidates_run_the_cpu_reference_and_pass_the_tolerance_gate():
    p = point_of(GEMM, 40)
    cands = candidates_for(parts_of(GEMM), "sm90")
    assert cands[0].id == "torch" and cands[0].fallback and cands[0].host == "torch"
    lane = registry.native_lane("sm90", "gemm")
    assert cands[1].id == lane.default.id and all(c.host == "oasr" for c in cands[1:])
    assert {c.id for c in cands if c.prewarm} == {"torch", lane.default.id, *(c.id for c in lane.coverage_basis)}
    ops = operands_for(p, "cpu", seed=1, copies=3)
    assert ops.copies == 3 and ops.weight_bytes() == 64 * 64 * 2
    want = reference_gemm(ops.acts["a"], ops.weights[2]["w"], ops.consts["bias"], "silu")
    assert torch.equal(cands[1].make_call(ops, 2)(), want)
    passed, rejected = gate_candidates(cands, ops)
    assert not rejected and [c.id for c in passed] == [c.id for c in cands]

    # a wrong "kernel" is caught by the tolerance gate (it launches fine and returns the wrong numbers)
    def wrong(o, config, copy):
        good = cands[0].bind(o, "torch", copy)
        return lambda: good() * 1.01
    bad = Candidate("broken", wrong, Gate("tolerance", "torch"))
    passed, rejected = gate_candidates([*cands[:2], bad], ops)
    assert [c.id for c in passed] == [cands[0].id, cands[1].id] and "max abs error" in rejected["broken"]


def test_scaled_mm_bitwise_gate_and_heuristic_pseudo_arm():
    from oasr_ops.families.scaled_mm.ops import heuristic_config

    cands = candidates_for(parts_of(SMM), "sm90")
    heur = cands[-1]
    assert heur.id == "heuristic" and heur.fallback and pseudo_arms(cands) == [heur]
    assert fallback_id(cands) == "heuristic" and all(c.host is None for c in cands)
    p = point_of(SMM, 48)
    assert heur.config_at(p) == heuristic_config(48, 64, 64, "sm90")
    ops = operands_for(p, "cpu", seed=2)
    passed, rejected = gate_candidates(cands, ops)
    assert not rejected and len(passed) == len(cands)

    def off_by_one(o, config, copy):
        good = heur.bind(o, cands[0].id, copy)
        return lambda: good() + 1
    bad = Candidate(cands[0].id + "_bad", off_by_one, cands[0].gate)
    _, rejected = gate_candidates([bad, heur], ops)
    assert rejected == {bad.id: "not bitwise equal to the heuristic's tile"}


def _census(tmp_path, sigs):
    path = tmp_path / "census.json"
    path.write_text(json.dumps({"weight_bytes": 0, "signatures": sigs}))
    return str(path)


def test_generic_build_measures_gemm_on_cpu(tmp_path, fake_bench):
    c = _census(tmp_path, {GEMM: {"points": [{"m": 16, "weight": 1.0, "calls": 4, "must_tune": True,
                                              "eager_fraction": 0.5},
                                             {"m": 200, "weight": 1.0, "calls": 4}]}})
    opts = build_mod.BuildOptions(out=str(tmp_path / "db"), family="gemm", arch="sm90", device="cpu", max_fill=0,
                                  rounds=3, log=tmp_path / "log.jsonl", checkpoint_dir=tmp_path / "ckpt",
                                  progress=False)
    res = build_mod.build([c], opts)
    # 16 and 200, and the validation point between them (round(sqrt(16 * 200)) = 57)
    assert not res.rejected and res.points_measured == 3 and res.validation_points == 1
    assert fake_bench["torch"] > 0 and fake_bench[FAST] > 0
    entry = res.entries[GEMM]
    assert entry["regions"] == [[16, FAST], [None, "torch"]]
    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert list(recs[0])[:10] == ["signature", "m", "config", "median_s", "gpu_s", "sigma_s", "n", "weight", "fill",
                                  "eager_fraction"]
    r = next(r for r in recs if r["m"] == 16 and r["config"] == "torch")
    assert r["median_s"] == pytest.approx(r["gpu_s"] + 0.5 * 2.0e-6)  # alpha x host issue cost
    doc = json.loads((tmp_path / "db" / "sm90" / "gemm.json").read_text())
    assert doc["entries"][GEMM]["regions"] == entry["regions"]
    # the log partitions again without a GPU to the same entry (`--from-log`)
    again, stamp = build_mod.entries_from_log(tmp_path / "log.jsonl", build_mod.BuildOptions(arch="sm90"))
    assert again[GEMM]["regions"] == entry["regions"] and stamp == recs[0]["validators"]


def test_generic_build_measures_scaled_mm_on_cpu(tmp_path, fake_bench):
    c = _census(tmp_path, {GEMM: {"points": [{"m": 16, "weight": 1.0, "calls": 4}, {"m": 48, "weight": 1.0}]}})
    opts = build_mod.BuildOptions(out=str(tmp_path / "db"), family="scaled_mm", arch="sm90", device="cpu",
                                  max_fill=0, rounds=3, log=tmp_path / "log.jsonl", progress=False)
    res = build_mod.build([c], opts)
    sig = "scaled_mm|op=scaled_mm|N=64|K=64"  # the quantized gemm site
    assert set(res.entries) == {sig} and not res.rejected
    assert res.entries[sig]["regions"][-1] == [None, "heuristic"]
    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert "gpu_s" not in recs[0] and "eager_fraction" not in recs[0]
    assert list(recs[0])[:9] == ["signature", "m", "config", "median_s", "sigma_s", "n", "weight", "fill",
                                 "heuristic_tile"]
    assert {r["config"] for r in recs} >= {"heuristic"}


def test_prewarm_measures_one_point_of_each_family_on_cpu(fake_bench):
    win = prewarm.measure_point(point_of(GEMM, 24, "fp16"), "sm90", device="cpu")
    lane = registry.native_lane("sm90", "gemm")
    timed = {"torch", lane.default.id, *(c.id for c in lane.coverage_basis)}
    assert win is not None and win[0] in timed
    assert win[0] == min(timed, key=lambda c: _synthetic_s(c, 24))
    assert set(fake_bench) == timed  # prewarm times only the compiled production set and torch
    cfg, _t = prewarm.measure_point(point_of(SMM, 24), "sm90", device="cpu")
    assert cfg in [c.id for c in candidates_for(parts_of(SMM), "sm90")]
