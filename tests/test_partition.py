import random
from dataclasses import asdict

import pytest

from oasr_ops.tune.partition import (
    CensusPoint, Segment, apply_gate, cross_eval_requests, partition_signature, segment, set_cover, thin_census,
    to_regions, top_k,
)
from oasr_ops.tune.stats import Estimate


def lookup(regions, m):
    """The runtime's round-up rule, written independently of the code under test."""
    for m_hi, cfg in regions:
        if m_hi is None or m <= m_hi:
            return cfg
    return None


# X covers {100, 200, 300}, W {100}, Y {300, 400}, Z {400} within 3 % of each point's best.
COVER_TABLE = {
    100: {"X": 1.00, "W": 0.99, "Y": 1.20, "Z": 1.30, "default": 2.0},
    200: {"X": 1.00, "W": 1.10, "Y": 1.10, "Z": 1.20, "default": 2.0},
    300: {"X": 1.02, "Y": 1.00, "W": 1.20, "Z": 1.20, "default": 2.0},
    400: {"Y": 1.00, "Z": 1.01, "X": 1.10, "W": 1.30, "default": 2.0},
}


def test_top_k_and_cross_eval_requests():
    t = {
        64: {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "default": 5.0},
        128: {"e": 1.0, "a": 3.0, "default": 4.0, "f": float("nan")},  # a failed arm is "not measured"
    }
    assert top_k(t) == {64: ["a", "b", "c"], 128: ["e", "a", "default"]}
    # 64's top-3 must be measured at 128 (b, c) and 128's at 64 (e); default is measured at 64 already.
    assert cross_eval_requests(t) == [(64, "e"), (128, "b"), (128, "c")]
    assert cross_eval_requests(t, always=["torch"]) == [(64, "e"), (64, "torch"), (128, "b"), (128, "c"),
                                                        (128, "torch")]
    done = {64: {**t[64], "e": 0.9}, 128: {**t[128], "b": 2.5, "c": 1.1}}
    # e entered 64's top-3 and c entered 128's: nothing new to measure (both are measured everywhere now).
    assert cross_eval_requests(done) == []


def test_set_cover_minimal_and_weighted():
    assert set_cover(COVER_TABLE) == ["X", "Y"]  # X covers 3 points; Y beats Z on the last (1.00 vs 1.01)
    # Heavy traffic at 300/400 makes Y the first pick; the set stays minimal.
    assert set_cover(COVER_TABLE, {100: 1, 200: 1, 300: 10, 400: 10}) == ["Y", "X"]
    # 1 % tolerance: X no longer covers 100 or 300, W is needed for 100.
    assert sorted(set_cover(COVER_TABLE, tol=0.01)) == ["W", "X", "Y"]


def test_dp_boundary_between_two_configs():
    t = {
        64: {"A": 1.0, "B": 2.0, "default": 4.0},
        128: {"A": 1.0, "B": 2.0, "default": 4.0},
        256: {"A": 2.0, "B": 4.0, "default": 8.0},
        512: {"A": 8.0, "B": 4.0, "default": 16.0},
        1024: {"A": 16.0, "B": 8.0, "default": 32.0},
    }
    p = partition_signature(t, {m: 1.0 for m in t})
    assert p.cover == ["A", "B"]
    assert [(s.ms, s.config) for s in p.segments] == [((64, 128, 256), "A"), ((512, 1024), "B")]
    assert p.regions == [[256, "A"], [1024, "B"], [None, "default"]]
    assert p.notes == ["M=64: A (4.00x vs default)", "M=128: A (4.00x vs default)", "M=256: A (4.00x vs default)",
                       "M=512: B (4.00x vs default)", "M=1024: B (4.00x vs default)"]


def test_dp_penalty_absorbs_an_isolated_marginal_win():
    # B wins 128 by 1 %; a region of its own there costs more than it saves.
    t = {
        64: {"A": 1.0, "B": 2.0, "default": 4.0},
        128: {"A": 1.01, "B": 1.0, "default": 4.0},
        256: {"A": 1.0, "B": 2.0, "default": 4.0},
        512: {"A": 3.0, "B": 1.0, "default": 4.0},
    }
    assert set_cover(t) == ["A", "B"]
    # oracle weighted time 4.0: penalty 0.008 per region. 4 regions: 4.0 + 0.032; A|A|A|B: 4.01 + 0.016.
    assert [(s.ms, s.config) for s in segment(t, None, ["A", "B"])] == [((64, 128, 256), "A"), ((512,), "B")]
    assert [(s.ms, s.config) for s in segment(t, None, ["A", "B"], region_penalty=0.0)] == [
        ((64,), "A"), ((128,), "B"), ((256,), "A"), ((512,), "B")]


def test_dp_does_not_fragment_on_noise():
    e = 1.0 + 2.0 ** -10  # exact in binary, so the two configs' sums tie exactly
    t = {m: {"P": (1.0 if i % 2 == 0 else e), "Q": (e if i % 2 == 0 else 1.0)} for i, m in enumerate([8, 16, 24, 32])}
    assert [(s.ms, s.config) for s in segment(t, None, ["P", "Q"])] == [((8, 16, 24, 32), "P")]
    assert len(segment(t, None, ["P", "Q"], region_penalty=0.0)) == 4


def test_dp_never_uses_a_config_where_it_was_not_measured():
    t = {
        64: {"A": 1.0, "B": 1.5},
        128: {"B": 1.5},           # A unmeasured here
        256: {"A": 1.0, "B": 1.5},
    }
    assert [(s.ms, s.config) for s in segment(t, None, ["A", "B"])] == [((64,), "A"), ((128,), "B"), ((256,), "A")]


def test_gate_keeps_the_fallback():
    t = {
        64: {"A": 1.0, "B": 2.0, "default": 1.03},
        128: {"A": 1.0, "B": 2.0, "default": 1.03},
        256: {"A": 3.0, "B": 1.0, "default": 2.0},
    }
    p = partition_signature(t, {64: 1, 128: 1, 256: 1})
    assert p.cover == ["A", "B"]
    # A beats default by only 1.03x < 1.05 on its region: default serves it (and becomes its own region).
    assert p.regions == [[128, "default"], [256, "B"], [None, "default"]]
    assert p.notes[0] == "M=64: default (fallback kept; best A 1.03x)"
    assert p.notes[2] == "M=256: B (2.00x vs default)"
    assert p.segments[0].dp_config == "A" and p.segments[0].speedup == pytest.approx(1.03)
    # Lower the gate and A stays.
    assert partition_signature(t, min_speedup=1.02).regions == [[128, "A"], [256, "B"], [None, "default"]]


def test_gate_is_weighted_over_the_region():
    t = {64: {"A": 1.0, "torch": 1.5}, 128: {"A": 10.0, "torch": 10.2}}
    seg = [Segment((64, 128), "A", "A")]
    # (1 x 1.5 + 1 x 10.2) / (1 x 1 + 1 x 10) = 1.0636 >= 1.05
    g = apply_gate(seg, t, {64: 1, 128: 1}, "torch")
    assert (g[0].config, round(g[0].speedup, 4)) == ("A", 1.0636)
    # (1.5 + 10 x 10.2) / (1 + 10 x 10) = 1.0248 < 1.05
    g = apply_gate(seg, t, {64: 1, 128: 10}, "torch")
    assert (g[0].config, round(g[0].speedup, 4)) == ("torch", 1.0248)
    # No fallback measurement in the region: no evidence of a win, the fallback stays.
    g = apply_gate([Segment((64,), "A", "A")], {64: {"A": 1.0}}, None, "torch")
    assert (g[0].config, g[0].speedup) == ("torch", None)


def test_fallback_must_be_measured():
    with pytest.raises(ValueError, match="torch"):
        partition_signature({64: {"A": 1.0}}, fallback="torch")


def test_catch_all_variants():
    segs = [Segment((64, 128), "A", "A"), Segment((512,), "B", "B")]
    assert to_regions(segs, "fallback", "torch") == [[128, "A"], [512, "B"], [None, "torch"]]
    assert to_regions(segs, "last", "torch") == [[128, "A"], [None, "B"]]
    assert to_regions(segs, None, "torch") == [[128, "A"], [512, "B"]]
    assert to_regions(segs, "B", "torch") == [[128, "A"], [None, "B"]]
    assert to_regions([Segment((64,), "A"), Segment((128,), "torch")], "fallback", "torch") == [
        [64, "A"], [None, "torch"]]


def test_round_up_regions_serve_every_measured_point_with_its_config():
    rng = random.Random(1234)
    ms = [8, 16, 24, 40, 64, 96, 128, 184, 256, 416, 512, 728, 1024, 2048, 4096]
    configs = [f"c{i}" for i in range(12)]
    t = {}
    for m in ms:
        t[m] = {c: m * rng.uniform(0.5, 1.5) for c in configs}
        t[m]["default"] = m * 0.6  # competitive: the gate hands several regions back to it
    weights = {m: rng.uniform(0.1, 2.0) for m in ms}
    for catch_all in ("fallback", "last", None):
        p = partition_signature(t, weights, catch_all=catch_all)
        served = {m: s.config for s in p.segments for m in s.ms}
        assert sorted(served) == ms
        for m in ms:
            assert lookup(p.regions, m) == served[m]
            assert served[m] in t[m]
        his = [hi for hi, _ in p.regions if hi is not None]
        assert his == sorted(his) and set(his) <= set(ms)  # every boundary is a measured M
        # Every region's config beats the fallback by the gate over the region.
        for s in p.segments:
            if s.config != "default":
                num = sum(weights[m] * t[m]["default"] for m in s.ms)
                den = sum(weights[m] * t[m][s.config] for m in s.ms)
                assert num / den >= 1.05 - 1e-9
    cfgs = [c for _, c in partition_signature(t, weights).regions]
    assert cfgs == ["default", "c3", "default", "c8", "default"]  # gated regions merged with their neighbours
    # Above the largest measured M: the fallback (build), the last region's config ("last"), nothing (autotune).
    assert lookup(partition_signature(t, weights).regions, 10 ** 6) == "default"
    assert lookup(partition_signature(t, weights, catch_all=None).regions, 10 ** 6) is None


def test_evidence_and_notes():
    t = {
        416: {"b32x64x64_w16x32x64_s3": Estimate(0.0061, 0.0001, 9), "default": (0.0122, 0.0002, 9),
              "other": 0.007, "slow": 0.05},
    }
    p = partition_signature(t, {416: 1.0}, starred={416}, evidence_extra={416: {"_l2": "cold"}})
    assert p.regions == [[416, "b32x64x64_w16x32x64_s3"], [None, "default"]]
    assert p.evidence == {"M=416": {"b32x64x64_w16x32x64_s3": [0.0061, 0.0001, 9], "other": [0.007, 0.0, 0],
                                    "default": [0.0122, 0.0002, 9], "_l2": "cold"}}
    assert p.notes == ["M=416*: b32x64x64_w16x32x64_s3 (2.00x vs default)"]
    assert p.entry()["source"] == "aot" and p.entry()["regions"] == p.regions


# ---------------------------------------------------------------------------------------------- thin_census

def _census():
    ms = [8, 16, 24, 40, 48, 64, 96, 160, 256, 512]
    weights = [1, 2, 5, 1, 1, 7, 1, 3, 2, 1]
    calls = [10, 20, 50, 10, 10, 70, 10, 30, 20, 10]
    must = {40, 96}
    eager = {16: 1.0}
    return [CensusPoint(m, float(w), c, m in must, eager.get(m, 0.0)) for m, w, c in zip(ms, weights, calls)]


def test_thin_census_bins_and_moves_up():
    # 3 log bins over [8, 512] (x4 each): [8,32) {16,24}, [32,128) {40,48,64,96}, [128,512] {160,256}.
    out = thin_census(list(reversed(_census())), 5)
    census_fields = ("m", "weight", "calls", "must_tune", "eager_fraction")
    assert [{f: asdict(p)[f] for f in census_fields} for p in out] == [
        {"m": 8, "weight": 1.0, "calls": 10, "must_tune": False, "eager_fraction": 0.0},
        {"m": 24, "weight": 7.0, "calls": 70, "must_tune": False, "eager_fraction": pytest.approx(2 / 7)},
        {"m": 64, "weight": 9.0, "calls": 90, "must_tune": True, "eager_fraction": 0.0},    # 40, 48 moved up
        {"m": 160, "weight": 4.0, "calls": 40, "must_tune": True, "eager_fraction": 0.0},   # 96 moved up
        {"m": 512, "weight": 3.0, "calls": 30, "must_tune": False, "eager_fraction": 0.0},  # 256 moved up
    ]
    assert sum(p.weight for p in out) == sum(p.weight for p in _census())
    assert _census()[1].weight == 2.0  # inputs untouched


def test_thin_census_dicts_ties_and_limits():
    pts = [{"m": m, "weight": 1.0, "calls": c, "must_tune": False} for m, c in
           [(8, 1), (16, 5), (24, 5), (512, 1)]]
    # One bin: 16 and 24 tie on weight and calls -> the smaller M stays; 24 moves into 512.
    out = thin_census(pts, 3)
    assert [(p["m"], p["weight"], p["calls"]) for p in out] == [(8, 1.0, 1), (16, 1.0, 5), (512, 2.0, 6)]
    assert [p["m"] for p in thin_census(pts, 2)] == [8, 512]
    assert thin_census(pts, 2)[-1]["weight"] == 3.0
    assert [p["m"] for p in thin_census(pts, 10)] == [8, 16, 24, 512]
    with pytest.raises(ValueError):
        thin_census(pts, 1)
    with pytest.raises(ValueError):
        thin_census(pts + [{"m": 8, "weight": 1.0}], 3)


def test_max_loss_keeps_a_losing_light_point_on_the_fallback():
    from oasr_ops.tune.partition import partition_signature

    # B wins big at the heavy point 64 but loses 30 % at the light point 16: the weighted gate alone would
    # give [64: B]; max_loss puts 16 back on the fallback.
    times = {16: {"torch": 1.0, "B": 1.3}, 64: {"torch": 10.0, "B": 5.0}}
    weights = {16: 0.01, 64: 1.0}
    loose = partition_signature(times, weights, fallback="torch")
    assert loose.regions[0] == [64, "B"]
    strict = partition_signature(times, weights, fallback="torch", max_loss=0.02)
    assert strict.regions == [[16, "torch"], [64, "B"], [None, "torch"]]
