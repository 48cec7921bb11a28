"""Regions that hold between measured points (issue 11, item 7): held-out midpoints split a region whose config
wins where it was measured but loses to the fallback in between. Synthetic tables, no GPU."""
import json

import pytest

from oasr_ops.tune.build import BuildOptions, SignatureWork, entries_from_log, plan_signature, validation_points
from oasr_ops.tune.partition import partition_signature
from oasr_ops.tune.points import Point
from oasr_ops.tune.region_guard import guard_entry, ratio_for_signature
from oasr_ops.tune.validation import geometric_midpoints, partition_validated, served_at

A, B = "t64x64x64_c1x1_pp", "t128x128x64_c1x1_pp"
SIG = "gemm|op=gemm|dt=half|N=512|K=256"


def _table():
    """Measured at 256, 1024, 4096: B wins at 1024 and 4096 (a region up to 4096). At the midpoint 2048 B loses
    to torch by 20 % (a wave-quantization cliff between the measured points); A wins at 256."""
    return {
        256: {"torch": 10.0, A: 5.0, B: 9.0},
        1024: {"torch": 20.0, A: 25.0, B: 10.0},
        2048: {"torch": 30.0, A: 40.0, B: 36.0},  # held out
        4096: {"torch": 60.0, A: 80.0, B: 30.0},
    }


def test_geometric_midpoints():
    assert geometric_midpoints([256, 1024, 4096]) == [512, 2048]
    assert geometric_midpoints([8, 15, 16]) == [11]  # 15 and 16 have no integer strictly between them
    assert geometric_midpoints([]) == [] and geometric_midpoints([7]) == []
    assert geometric_midpoints([24000, 24032, 40000]) == [31005]  # 24000/24032: too close to check between


def test_served_at_rounds_up():
    regs = [[256, A], [4096, B], [None, "torch"]]
    assert [served_at(regs, m) for m in (1, 256, 257, 4096, 5000)] == [A, A, B, B, "torch"]
    assert served_at([[16, A]], 17) is None


def test_a_region_losing_at_its_midpoint_is_split():
    t, w = _table(), {256: 1.0, 1024: 1.0, 2048: 0.01, 4096: 1.0}
    blind = partition_signature({m: r for m, r in t.items() if m != 2048}, w, fallback="torch", max_loss=0.02)
    assert blind.regions == [[256, A], [4096, B], [None, "torch"]]  # B would serve 2048 at 0.83x torch
    v = partition_validated(t, w, [2048], fallback="torch", max_loss=0.02)
    assert v.promoted == [2048] and v.splits == 1
    assert served_at(v.partition.regions, 2048) == "torch"
    assert served_at(v.partition.regions, 4096) == B and served_at(v.partition.regions, 1024) == B
    assert v.partition.regions == [[256, A], [1024, B], [2048, "torch"], [4096, B], [None, "torch"]]


def test_holding_midpoints_change_nothing_and_are_noted():
    t = _table()
    t[2048] = {"torch": 30.0, A: 40.0, B: 29.0}  # B holds at the midpoint
    w = {256: 1.0, 1024: 1.0, 2048: 0.01, 4096: 1.0}
    v = partition_validated(t, w, [2048], fallback="torch", max_loss=0.02)
    plain = partition_signature({m: r for m, r in t.items() if m != 2048}, w, fallback="torch", max_loss=0.02)
    assert v.splits == 0 and v.partition.regions == plain.regions
    assert v.checks[2048][0] == B and v.checks[2048][1] == pytest.approx(30 / 29)
    assert any(n.startswith("M=2048 (held out): ") for n in v.partition.notes)
    # with no held-out points it is exactly partition_signature
    assert partition_validated({m: r for m, r in t.items() if m != 2048}, w, (), fallback="torch",
                               max_loss=0.02).partition.entry() == plain.entry()


def test_within_max_loss_is_not_a_failure():
    t = _table()
    t[2048] = {"torch": 30.0, B: 30.5}  # 1.7 % slower: inside the 2 % guard
    v = partition_validated(t, {256: 1, 1024: 1, 2048: 0.01, 4096: 1}, [2048], fallback="torch", max_loss=0.02)
    assert v.splits == 0


def test_build_plans_validation_points_between_every_measured_m():
    work = SignatureWork(SIG, [Point(256, 1.0), Point(4096, 1.0)])
    pts = plan_signature(work, BuildOptions(max_fill=1))
    main = [p.m for p in pts if not p.validation]
    held = [p for p in pts if p.validation]
    assert [p.m for p in held] == geometric_midpoints(main)
    assert all(p.weight < 0.1 for p in held) and not any(p.fill for p in held)
    assert not any(p.validation for p in plan_signature(work, BuildOptions(max_fill=1, validate=False)))
    assert validation_points([Point(8, 1.0)]) == []


def test_from_log_validates_like_the_build(tmp_path):
    recs = []
    for m, row in _table().items():
        for c, t in row.items():
            r = {"signature": SIG, "m": m, "config": c, "median_s": t * 1e-6, "sigma_s": 0.0, "n": 3,
                 "weight": 0.01 if m == 2048 else 1.0, "fill": False, "l2": "cold"}
            if m == 2048:
                r["validation"] = True
            recs.append(r)
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    entries, _ = entries_from_log(log, BuildOptions(arch="sm90"))
    assert served_at(entries[SIG]["regions"], 2048) == "torch"
    # the same log without the flag (an old log): 2048 is an ordinary point, as before
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "validation"}) + "\n" for r in recs))
    old, _ = entries_from_log(log, BuildOptions(arch="sm90"))
    t = {m: {c: (v * 1e-6, 0.0, 3) for c, v in row.items()} for m, row in _table().items()}
    w = {m: 0.01 if m == 2048 else 1.0 for m in t}
    want = partition_signature(t, w, fallback="torch", max_loss=0.02,
                               evidence_extra={m: {"_l2": "cold"} for m in t}).entry("aot")
    want = guard_entry(want, t, "torch", ratio_for_signature(SIG, "sm90"))  # then the wave guard, as the build
    assert old[SIG] == want
