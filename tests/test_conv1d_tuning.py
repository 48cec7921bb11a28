"""The conv1d family is tunable like every family: candidates over the depthwise config space with cuDNN as the
fallback arm, seeded operands with a float64 reference, the tolerance gate, and the generic build writing regions
over M = B * T (CPU: the op's reference runs inside every candidate; only bench.measure's GPU timing is
synthetic, as in tests/test_candidates.py)."""
from __future__ import annotations

import json

import pytest
import torch

from oasr_ops.families.conv1d.lanes import DWCONV_DEFAULT, SM80_F16_DWCONV
from oasr_ops.tune import bench, build as build_mod, prewarm
from oasr_ops.tune.candidates import (Candidate, Gate, candidates_for, fallback_id, gate_candidates, operands_for,
                                      parts_of, tunable_families)
from oasr_ops.tune.points import point_of
from oasr_ops.tune.stats import Estimate

BTC = "conv1d|op=conv1d_btc|dt=half|N=64|K=7"
BCT = "conv1d|op=conv1d|dt=half|N=64|K=7"
FAST = "dw16x64_v8_n128"  # the synthetic winner at small M


def _synthetic_s(name: str, m: int) -> float:
    if name == FAST:
        return 1e-6 if m <= 32 else 9e-6
    return 5e-6 if name == "torch" else 7e-6


@pytest.fixture
def fake_bench(monkeypatch):
    ran: dict[str, int] = {}

    def measure(arms, *, rounds=7, seed=0, eager=frozenset(), env=None):
        out = {}
        for name, calls in arms.items():
            results = [c() for c in calls]
            assert all(isinstance(r, torch.Tensor) and r.shape[-1] == 64 for r in results)
            ran[name] = ran.get(name, 0) + len(calls)
            t = _synthetic_s(name, int(results[0].shape[1]))  # [1, M, C]: M frames
            out[name] = bench.ArmResult(Estimate(t, 0.0, rounds), [t] * rounds)
        return out

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "l2_bytes", lambda: 32 * 1024)
    monkeypatch.setattr(bench, "host_overhead_us", lambda fn, iters=2000: (fn(), 2.0)[1])
    return ran


def test_conv1d_is_tunable_with_the_lane_default_as_the_fallback():
    assert "conv1d" in tunable_families()
    for sig in (BTC, BCT):
        cands = candidates_for(parts_of(sig), "sm90")
        ids = [c.id for c in cands]
        assert ids[0] == "torch" and ids[1] == DWCONV_DEFAULT.id
        assert set(ids[1:]) == {c.id for c in SM80_F16_DWCONV.space} and len(ids) == len(set(ids))
        # the untuned answer is the partition's fallback (and the catch-all above the measured Ms), not cuDNN
        assert fallback_id(cands) == DWCONV_DEFAULT.id and sum(c.fallback for c in cands) == 1
        assert {c.id for c in cands if c.prewarm} == {"torch", DWCONV_DEFAULT.id,
                                                       *(c.id for c in SM80_F16_DWCONV.coverage_basis)}
    # an even or too-wide kernel has no direct-kernel arm: cuDNN only
    assert [c.id for c in candidates_for(parts_of("conv1d|op=conv1d|dt=half|N=64|K=33"), "sm90")] == ["torch"]


@pytest.mark.parametrize("sig,dtype,m", [(BTC, "fp16", 1), (BTC, "bf16", 250), (BCT, "fp16", 7), (BCT, "bf16", 31)])
def test_operands_are_seeded_and_every_arm_passes_the_gate(sig, dtype, m):
    p = point_of(sig, m, dtype)
    ops = operands_for(p, "cpu", seed=5, copies=2)
    again = operands_for(p, "cpu", seed=5)
    assert torch.equal(ops.acts["x"], again.acts["x"]) and ops.acts["x"].dtype == getattr(torch, {
        "fp16": "float16", "bf16": "bfloat16"}[dtype])
    assert ops.copies == 2 and ops.weights[0]["w"].dtype == torch.float32
    cands = candidates_for(parts_of(sig), "sm90")
    passed, rejected = gate_candidates(cands, ops)
    assert not rejected and [c.id for c in passed] == [c.id for c in cands]
    out = cands[1].make_call(ops, 1)()
    assert out.shape == ops.acts["x"].shape

    def wrong(o, config, copy):  # a kernel that launches and returns the wrong numbers is caught
        good = cands[0].bind(o, "torch", copy)
        return lambda: good() * 1.05
    _, rejected = gate_candidates([cands[0], Candidate("broken", wrong, Gate("tolerance", "torch"))], ops)
    assert "broken" in rejected


def test_generic_build_writes_conv1d_regions_over_b_times_t(tmp_path, fake_bench):
    census = tmp_path / "census.json"
    census.write_text(json.dumps({"weight_bytes": 0, "signatures": {BTC: {"points": [
        {"m": 16, "weight": 1.0, "calls": 16, "must_tune": True}, {"m": 400, "weight": 1.0, "calls": 16}]}}}))
    opts = build_mod.BuildOptions(out=str(tmp_path / "db"), family="conv1d", arch="sm90", device="cpu", max_fill=0,
                                  rounds=3, log=tmp_path / "log.jsonl", checkpoint_dir=tmp_path / "ckpt",
                                  progress=False)
    res = build_mod.build([str(census)], opts)
    assert not res.rejected and res.points_measured == 3  # 16, 400 and the validation midpoint 80
    # cuDNN serves where it measured faster (here, synthetically, at 400); above the measured Ms the lane default
    want = [[16, FAST], [400, "torch"], [None, DWCONV_DEFAULT.id]]
    assert res.entries[BTC]["regions"] == want
    doc = json.loads((tmp_path / "db" / "sm90" / "conv1d.json").read_text())
    assert doc["kernel_family"] == "conv1d" and doc["entries"][BTC]["regions"] == want


def test_prewarm_measures_a_conv1d_point_on_cpu(fake_bench):
    win = prewarm.measure_point(point_of(BTC, 24, "fp16"), "sm90", device="cpu")
    timed = {"torch", DWCONV_DEFAULT.id, *(c.id for c in SM80_F16_DWCONV.coverage_basis)}
    assert win is not None and win[0] in timed and set(fake_bench) == timed
