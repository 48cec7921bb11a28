"""The conv2d_activation family is tunable like every family: candidates over the lane with cuDNN (NHWC) as the
fallback arm, seeded operands with a float64 reference, the tolerance gate, and the generic build writing regions
over M = B * Ho * Wo (CPU: the op's reference runs inside every candidate; only bench.measure's GPU timing is
synthetic, as in tests/test_conv1d_tuning.py)."""
from __future__ import annotations

import json

import pytest
import torch

from oasr_ops.families.conv2d_activation.lanes import DIRECT_DEFAULT, SM90_F16_CONV2D
from oasr_ops.tune import bench, build as build_mod
from oasr_ops.tune.candidates import (Candidate, Gate, candidates_for, fallback_id, gate_candidates, operands_for,
                                      parts_of, tunable_families)
from oasr_ops.tune.points import point_of
from oasr_ops.tune.stats import Estimate

FIRST = "conv2d_activation|op=conv2d_k3s2|dt=half|N=16|K=9"
SECOND = "conv2d_activation|op=conv2d_k3s2|dt=half|N=16|K=288"  # Cin = 32: implicit GEMM only
FAST = "dc128x128_v8_n256"  # the synthetic winner at small M


def _synthetic_s(name: str, m: int) -> float:
    if name == FAST:
        return 1e-6 if m <= 400 else 9e-6
    return 5e-6 if name == "torch" else 7e-6


@pytest.fixture
def fake_bench(monkeypatch):
    ran: dict[str, int] = {}

    def measure(arms, *, rounds=7, seed=0, eager=frozenset(), env=None):
        out = {}
        for name, calls in arms.items():
            results = [c() for c in calls]
            assert all(isinstance(r, torch.Tensor) and r.dim() == 4 and r.shape[-1] == 16 for r in results)
            ran[name] = ran.get(name, 0) + len(calls)
            t = _synthetic_s(name, int(results[0].shape[1] * results[0].shape[2]))  # [1, Ho, Wo, C]
            out[name] = bench.ArmResult(Estimate(t, 0.0, rounds), [t] * rounds)
        return out

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "l2_bytes", lambda: 32 * 1024)
    monkeypatch.setattr(bench, "host_overhead_us", lambda fn, iters=2000: (fn(), 2.0)[1])
    return ran


def test_conv2d_is_tunable_with_cudnn_as_the_fallback():
    assert "conv2d_activation" in tunable_families()
    cands = candidates_for(parts_of(FIRST), "sm90")
    ids = [c.id for c in cands]
    assert ids[:3] == ["torch", "fused", DIRECT_DEFAULT.id]
    assert set(ids[2:]) == {c.id for c in SM90_F16_CONV2D.space if c.generation == "dc"}
    assert fallback_id(cands) == "torch" and sum(c.fallback for c in cands) == 1
    ids2 = [c.id for c in candidates_for(parts_of(SECOND), "sm90")]
    assert ids2[:2] == ["torch", "fused"] and set(ids2[2:]) == {c.id for c in SM90_F16_CONV2D.space
                                                                  if c.generation != "dc"}
    # K neither small nor a multiple of 8 (Cin = 25): cuDNN only
    assert [c.id for c in candidates_for(parts_of("conv2d_activation|op=conv2d_k3s1|dt=half|N=16|K=225"),
                                         "sm90")] == ["torch", "fused"]


@pytest.mark.parametrize("sig,dtype,m", [(FIRST, "fp16", 1), (FIRST, "bf16", 250), (SECOND, "fp16", 19),
                                         (SECOND, "bf16", 77)])
def test_operands_are_seeded_and_every_arm_passes_the_gate(sig, dtype, m):
    p = point_of(sig, m, dtype)
    ops = operands_for(p, "cpu", seed=5, copies=2)
    again = operands_for(p, "cpu", seed=5)
    assert torch.equal(ops.acts["x"], again.acts["x"])
    assert ops.acts["x"].dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype] and ops.copies == 2
    cands = candidates_for(parts_of(sig), "sm90")
    passed, rejected = gate_candidates(cands, ops)
    assert not rejected and [c.id for c in passed] == [c.id for c in cands]
    out = cands[2].make_call(ops, 1)()
    assert out.dim() == 4 and out.shape[1] * out.shape[2] >= m

    def wrong(o, config, copy):  # a kernel that launches and returns the wrong numbers is caught
        good = cands[0].bind(o, "torch", copy)
        return lambda: good() * 1.05
    _, rejected = gate_candidates([cands[0], Candidate("broken", wrong, Gate("tolerance", "torch"))], ops)
    assert "broken" in rejected


def test_generic_build_writes_conv2d_regions_over_m(tmp_path, fake_bench):
    census = tmp_path / "census.json"
    census.write_text(json.dumps({"weight_bytes": 0, "signatures": {FIRST: {"points": [
        {"m": 390, "weight": 1.0, "calls": 1, "must_tune": True}, {"m": 3900, "weight": 1.0, "calls": 1}]}}}))
    opts = build_mod.BuildOptions(out=str(tmp_path / "db"), family="conv2d_activation", arch="sm90", device="cpu",
                                  max_fill=0, rounds=3, log=tmp_path / "log.jsonl", checkpoint_dir=tmp_path / "ckpt",
                                  progress=False)
    res = build_mod.build([str(census)], opts)
    assert not res.rejected and res.points_measured >= 2
    regions = res.entries[FIRST]["regions"]
    assert regions[0][1] == FAST and regions[-1] == [None, "torch"]
    doc = json.loads((tmp_path / "db" / "sm90" / "conv2d_activation.json").read_text())
    assert doc["kernel_family"] == "conv2d_activation" and doc["entries"][FIRST]["regions"] == regions
