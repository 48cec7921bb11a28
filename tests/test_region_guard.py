"""The wave guard (tune/region_guard.py): stretches of a CUTLASS region past a wave edge go to the fallback."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from oasr_ops.tune.region_guard import MARGIN, guard_entry, guard_regions, ratio_for_signature, structural_ratio
from oasr_ops.tune.validation import served_at

CFG = "t128x128x64_c1x1_pp"


def _wave_ratio(period_tiles: int):
    """A synthetic T_config / T_torch: the config runs ceil(tiles / period) waves while torch is smooth, so the
    ratio is worst just past a wave edge and best at a full wave."""
    def ratio(cid: str, m: int) -> float | None:
        if cid != CFG:
            return None
        tiles = -(-m // 128)
        waves = -(-tiles // period_tiles)
        return waves * period_tiles / tiles  # >= 1; 1 at a full wave
    return ratio


def served_tile(regions, m: int, sig: str) -> str:
    """The tile a region table runs at M: a ``heuristic`` region resolved by the family's current rule."""
    from oasr_ops.tune.region_guard import pseudo_arm_resolver

    cfg = served_at(regions, m)
    resolve = pseudo_arm_resolver(sig, "sm90")
    return resolve(cfg, m) if resolve is not None else cfg


def test_losing_stretches_go_to_the_fallback_and_measured_wins_stay():
    # measured at two full-wave Ms (tiles 10 and 20 of period 10), 1.10x faster than torch there
    table = {1280: {"torch": 11.0, CFG: 10.0}, 2560: {"torch": 11.0, CFG: 10.0}}
    regions, notes = guard_regions([[1280, "torch"], [2560, CFG], [None, "torch"]], table, "torch", _wave_ratio(10))
    assert served_at(regions, 2560) == CFG  # the measured win is kept
    assert served_at(regions, 2560 - 127) == CFG  # same tile count as the anchor
    # tiles 11 (M=1281..1408): 2 waves for 11 tiles -> predicted 1.10 * 10/20*... < 1.03: torch
    assert served_at(regions, 1300) == "torch"
    # every M the guard keeps is predicted to win by the margin from both anchors
    r = _wave_ratio(10)
    for m in range(1281, 2561):
        pred = 1.1 * 1.0 / r(CFG, m)
        assert (served_at(regions, m) == CFG) == (pred >= 1 + MARGIN), m
    assert served_at(regions, 1000) == "torch" and served_at(regions, 10 ** 6) == "torch"
    assert notes and "to torch" in notes[0]
    # rows stay sorted and adjacent rows differ
    his = [h for h, _ in regions[:-1]]
    assert his == sorted(his) and all(a[1] != b[1] for a, b in zip(regions, regions[1:]))


def test_a_region_winning_everywhere_is_unchanged():
    table = {256: {"torch": 20.0, CFG: 10.0}, 1024: {"torch": 20.0, CFG: 10.0}}
    regions = [[1024, CFG], [None, "torch"]]
    out, notes = guard_regions(regions, table, "torch", lambda c, m: 0.9)  # no wave structure: a flat ratio
    assert out == regions and notes == []
    # with the wave structure, the underfilled first waves (1 tile of 10 at M <= 128) lose their 2x win
    out, _ = guard_regions(regions, table, "torch", _wave_ratio(10))
    assert served_at(out, 100) == "torch" and served_at(out, 1024) == CFG


def test_unmodelled_configs_other_fallbacks_and_no_ratio_are_left_alone():
    table = {1280: {"torch": 11.0, CFG: 10.0, "heuristic": 12.0}}
    regions = [[1280, CFG], [None, "torch"]]
    assert guard_regions(regions, table, "torch", lambda c, m: None)[0] == regions
    entry = {"regions": [[1280, CFG], [None, "heuristic"]], "notes": []}
    assert guard_entry(entry, table, "heuristic", _wave_ratio(10)) == entry  # not a cuBLAS fallback
    assert guard_entry({"regions": regions, "notes": []}, table, "torch", None)["regions"] == regions


def test_the_real_structure_flags_the_measured_h200_loser():
    # db/sm90/gemm.json before the guard: N=1024 K=1024 served 128x128 over (3538, 24032]; on the H200 it won
    # 1.08x at the measured M=6112 (2.9 waves) and lost 0.83x at the held-out M=4650 (2.2 waves).
    ratio = structural_ratio(1024, 1024, "fp16", "sm90")
    table = {6112: {"torch": 22.66, CFG: 21.0}}
    regions, _ = guard_regions([[3538, "torch"], [6112, CFG], [None, "torch"]], table, "torch", ratio)
    assert served_at(regions, 4650) == "torch"
    assert served_at(regions, 6112) == CFG


@pytest.mark.parametrize("sig,modelled", [
    ("gemm|op=gemm|dt=half|N=1024|K=1024", True),
    ("gemm|op=gemm_activation|dt=bf16|N=1024|K=1024", True),
    ("scaled_mm_fp8|op=scaled_mm_fp8|N=1024|K=1024", True),  # wave_guard_dtype="fp8"
    ("scaled_mm_fp8|op=scaled_mm_fp8_quant|N=1024|K=1024", True),
    ("scaled_mm|op=scaled_mm|N=1024|K=1024", False),
    ("not a signature", False),
])
def test_ratio_only_for_modelled_or_wave_guarded_families(sig, modelled):
    assert (ratio_for_signature(sig, "sm90") is not None) == modelled


# ---- the fp8 family (scaled_mm_fp8): guarded through its spec's wave_guard_dtype, not a cost-model tier

LOGS = Path(__file__).resolve().parent.parent / "benchmarks" / "logs"
FP8_LOG = LOGS / "sm90_scaled_mm_fp8_build_v1.jsonl"  # the first H200 build: the losers below were measured on it
FP8_TILES = ("t128x256x128_c1x1_coop_fa", "t128x128x128_c2x1_pp_fa", "t64x128x128_c1x1_pp_fa",
             "t64x16x256_c1x1_pp_fa_swab", "t64x64x256_c1x1_pp_swab", "t128x128x128_c1x1_sk_fa",
             "t128x128x128_c1x1_coop")


def test_fp8_ratio_describes_every_fp8_tile_with_its_wave_steps():
    ratio = ratio_for_signature("scaled_mm_fp8|op=scaled_mm_fp8|N=512|K=512", "sm90")
    for cid in FP8_TILES:
        r = ratio(cid, 4096)
        assert r is not None and math.isfinite(r) and r > 0, cid
    # a data-parallel tile's predicted time is flat inside one tile row and jumps past a wave edge (N=512:
    # 128x256 tiles -> 2 column tiles; 132 SMs -> a wave every 66 tile rows = 8448 rows)
    t = "t128x256x128_c1x1_coop_fa"
    assert ratio(t, 8448) < ratio(t, 8449)
    assert ratio(t, 8449) > ratio(t, 8448 + 128 * 30)  # the new wave fills up, torch keeps growing


def test_swap_ab_structure_is_the_transposed_problem():
    from oasr_ops.configs import parse
    from oasr_ops.runtime import cost_model
    from oasr_ops.runtime.arch_profile import reference_profile

    prof = reference_profile("sm90")
    swab, plain = parse("t64x16x256_c1x1_pp_fa_swab"), parse("t64x16x256_c1x1_pp_fa")
    for m, n, k in ((100, 512, 512), (1000, 4096, 1024), (7, 256, 4864)):
        assert cost_model.structure(swab, m, n, k, "fp8", prof) == cost_model.structure(plain, n, m, k, "fp8", prof)
    # the guard steps a swap-AB region by its tile's N (tokens), probes included
    probes = cost_model.probe_ms(swab, 0, 4096, 512, "fp8", prof)
    assert all((p - 1) % 16 == 0 for p in probes if p not in (1, 4096))


def _fp8_log_entries(log: Path = FP8_LOG):
    from oasr_ops.tune.build import BuildOptions, entries_from_log

    return entries_from_log(log, BuildOptions(arch="sm90"))[0]


def test_fp8_guard_hands_the_measured_h200_losers_to_torch():
    # benchmarks/logs/sm90_scaled_mm_fp8_bench.json, the shipped DB before the guard: at M=4096 these tiles lost
    # to torch._scaled_mm (0.72x at N=K=512, 0.93x / 0.91x at N=512 K=256 / 2048; 0.94x at M=16384 N=256
    # K=1024), each between measured points of its region (3552 and 9233 / 10208; 15663 and 24032)
    # and the held-out Ms where the uncapped guard's tiles measured 0.85-0.93x (between_fp8.json, H200, first run
    # of benchmarks/db_between_points.py --family scaled_mm_fp8): the capped guard hands them to torch
    entries = _fp8_log_entries()
    for n, k, m in ((512, 512, 4096), (512, 256, 4096), (512, 2048, 4096), (256, 1024, 16384),
                    (1024, 4096, 3841), (256, 4864, 16641), (256, 4864, 7041), (1024, 1024, 3841)):
        regions = entries[f"scaled_mm_fp8|op=scaled_mm_fp8|N={n}|K={k}"]["regions"]
        assert served_at(regions, m) == "torch", (n, k, m)


def test_fp8_guard_keeps_tiles_where_the_build_measured_them_winning():
    from oasr_ops.tune.from_log import log_tables
    import json

    tables = log_tables([json.loads(line) for line in FP8_LOG.read_text().splitlines() if line.strip()])[0]
    entries = _fp8_log_entries()
    kept = 0
    for sig, table in tables.items():
        regions = entries[sig]["regions"]
        for m, row in table.items():
            cfg = served_tile(regions, m, sig)
            if cfg != "torch" and cfg in row and "torch" in row:
                kept += 1
                assert row["torch"][0] >= row[cfg][0], (sig, m, cfg)  # never served where measured losing
    assert kept >= 50  # the guard does not hand everything to torch


def test_shipped_fp8_db_is_its_log_partitioned_with_the_guard():
    """db/sm90/scaled_mm_fp8.json is `oasr tune build --from-log` of one of the shipped fp8 build logs
    (benchmarks/logs/sm90_scaled_mm_fp8_build*.jsonl) under the current rules: a rebuilt DB ships with its log."""
    import json

    shipped = json.loads((LOGS.parent.parent / "db" / "sm90" / "scaled_mm_fp8.json").read_text())
    want = {sig: e["regions"] for sig, e in shipped["entries"].items()}
    logs = sorted(LOGS.glob("sm90_scaled_mm_fp8_build*.jsonl"))
    assert logs
    got = {log.name: {sig: e["regions"] for sig, e in _fp8_log_entries(log).items()} for log in logs}
    assert any(g == want for g in got.values()), f"no log in {sorted(got)} partitions to the shipped file"


@pytest.mark.parametrize("family,log", [("gemm", "sm90_gemm_build.jsonl"), ("scaled_mm", "sm90_scaled_mm_build.jsonl"),
                                        ("conv1d", "sm90_conv1d_build_s8.jsonl")])
def test_shipped_db_is_its_log_partitioned_by_the_current_rules(family, log):
    """Every shipped sm90 file is what `oasr tune build --from-log` writes from its log today (the fp8 file above
    too): db/sm90/gemm.json had been partitioned before the wave guard and stopped reproducing (3 signatures
    lacked guarded regions past M = 6016; 1.3 % geomean regret on its log vs 0.8 % re-partitioned; session 26)."""
    import json

    from oasr_ops.tune.build import BuildOptions, entries_from_log

    shipped = json.loads((LOGS.parent.parent / "db" / "sm90" / f"{family}.json").read_text())["entries"]
    got = entries_from_log(LOGS / log, BuildOptions(arch="sm90"), family=family)[0]
    assert set(got) == set(shipped)
    for sig, e in shipped.items():
        assert got[sig]["regions"] == e["regions"], sig
        assert got[sig].get("regions_eager") == e.get("regions_eager"), sig


def test_capped_guard_never_predicts_above_the_anchor():
    # a tile measured 0.996x at M=1280 (10 tiles of period 10: a full wave), the fallback predicted to grow faster
    # than the tile above it (the ratio falls): uncapped, the guard credits that growth; capped, it cannot
    table = {1280: {"torch": 9.96, CFG: 10.0}, 2560: {"torch": 12.0, CFG: 10.0}}

    def falling(cid: str, m: int) -> float | None:
        return 0.9 if m > 1280 else 1.0  # past the anchor the fallback steps up by 11 %, the tile does not
    regions = [[1280, "torch"], [2560, CFG], [None, "torch"]]
    loose, _ = guard_regions(regions, table, "torch", falling)
    capped, _ = guard_regions(regions, table, "torch", falling, cap_at_anchor=True)
    assert served_at(loose, 1300) == CFG  # 0.996 / 0.9 = 1.107 predicted from the 0.996x anchor
    assert served_at(capped, 1300) == "torch" and served_at(capped, 2432) == "torch"  # min(0.996, ...) < 1.03
    assert served_at(capped, 2560) == CFG  # the measured 1.2x win stays


def test_only_the_fp8_family_is_capped():
    from oasr_ops.tune.region_guard import capped_at_anchor

    assert capped_at_anchor("scaled_mm_fp8|op=scaled_mm_fp8|N=1024|K=1024")
    assert not capped_at_anchor("gemm|op=gemm|dt=half|N=1024|K=1024")  # validated uncapped (cost_model.md)
    assert not capped_at_anchor("not a signature")


# ---- the calibrated fp8 ratio (region_guard.calibrated_ratio): per-config fits on the signature's own points

FP8_REBUILT_LOG = LOGS / "sm90_scaled_mm_fp8_build.jsonl"  # the second H200 build's (the calibrated guard's first)
FP8_V3_LOG = LOGS / "sm90_scaled_mm_fp8_build_v3.jsonl"  # the third build's: the shipped file is its partition


def _log_table(log: Path, sig: str):
    import json

    from oasr_ops.tune.from_log import log_tables

    return log_tables([json.loads(line) for line in log.read_text().splitlines() if line.strip()])[0][sig]


def test_interpolated_is_linear_between_points_and_flat_outside():
    from oasr_ops.tune.region_guard import interpolated

    f = interpolated([(100, 2.0), (10, 1.0), (200, 4.0)])  # unsorted input
    assert f(10) == 1.0 and f(100) == 2.0 and f(200) == 4.0
    assert f(55) == pytest.approx(1.5) and f(150) == pytest.approx(3.0)
    assert f(1) == 1.0 and f(10 ** 6) == 4.0
    with pytest.raises(ValueError):
        interpolated([])


def test_calibrated_ratio_only_for_wave_guarded_families_with_a_measured_fallback():
    from oasr_ops.tune.region_guard import calibrated_ratio

    table = {m: {"torch": (1e-5 * m / 1000, 0.0, 3), CFG: (1e-5, 0.0, 3)} for m in (1000, 2000, 3000)}
    assert calibrated_ratio("gemm|op=gemm|dt=half|N=1024|K=1024", table, "torch", "sm90") is None  # structural
    sig = "scaled_mm_fp8|op=scaled_mm_fp8|N=1024|K=1024"
    assert calibrated_ratio(sig, {1000: table[1000]}, "torch", "sm90") is None  # one fallback point
    assert calibrated_ratio(sig, table, "torch", "sm90") is not None


def test_calibrated_ratio_prices_the_fallback_at_its_measured_points():
    from oasr_ops.tune.partition import _medians
    from oasr_ops.tune.region_guard import calibrated_ratio

    sig = "scaled_mm_fp8|op=scaled_mm_fp8|N=3072|K=1024"
    table = _log_table(FP8_REBUILT_LOG, sig)
    med = _medians(table)
    ratio = calibrated_ratio(sig, table, "torch", "sm90")
    tile = "t128x128x128_c2x1_pp_fa"
    from oasr_ops.configs import parse
    from oasr_ops.runtime import cost_model
    from oasr_ops.runtime.arch_profile import reference_profile
    from oasr_ops.runtime.cost_model import Calibration
    from oasr_ops.tune.calibrate import fit_table

    prof = reference_profile("sm90")
    cal = Calibration("sm90", "fp8", configs=fit_table(med, 3072, 1024, "fp8", prof))
    assert tile in cal.configs
    for m, row in med.items():
        t_c = cost_model.predict_s(parse(tile), m, 3072, 1024, "fp8", prof, cal)
        assert ratio(tile, m) == pytest.approx(t_c / row["torch"])  # the fallback's own measured time


def test_calibrated_guard_hands_the_h200_heldout_loser_to_torch():
    # H200 (sm90_scaled_mm_fp8_between_rebuilt.json): the shipped DB served 128x128 2x1 ping-pong FastAccum at the
    # held-out M=1025 of N=3072 K=1024 and it measured 0.85x of torch._scaled_mm (13.1 vs 11.1 us): two waves
    # like the measured M=1024 (10.0 us), which the structural ratio extrapolated from. The calibrated guard
    # sends M=1025 to torch; the structural one (the rule before) kept it.
    from oasr_ops.tune.build import BuildOptions
    from oasr_ops.tune.from_log import partition_logged, log_tables
    import json

    sig = "scaled_mm_fp8|op=scaled_mm_fp8|N=3072|K=1024"
    recs = [json.loads(line) for line in FP8_REBUILT_LOG.read_text().splitlines() if line.strip()]
    tables, weights, held, _ = log_tables(recs)
    o = BuildOptions(arch="sm90")
    entry = partition_logged(sig, tables[sig], weights[sig], held[sig], "sm90", o.min_speedup, o.max_loss)
    assert served_at(entry["regions"], 1025) == "torch"
    assert served_tile(entry["regions"], 3552, sig) == "t128x128x128_c2x1_pp_fa"  # measured 1.23x: kept
    unguarded = {**entry, "regions": [[1024, "torch"], [24032, "t128x128x128_c2x1_pp_fa"], [None, "torch"]]}
    structural = guard_entry(unguarded, tables[sig], "torch", ratio_for_signature(sig, "sm90"), cap_at_anchor=True)
    assert served_at(structural["regions"], 1025) == "t128x128x128_c2x1_pp_fa"


@pytest.mark.parametrize("log", [FP8_REBUILT_LOG, FP8_V3_LOG], ids=["build", "build_v3"])
@pytest.mark.parametrize("sig", ["scaled_mm_fp8|op=scaled_mm_fp8|N=3072|K=1024",
                                 "scaled_mm_fp8|op=scaled_mm_fp8|N=1024|K=512",
                                 "scaled_mm_fp8|op=scaled_mm_fp8|N=512|K=512",
                                 "scaled_mm_fp8|op=scaled_mm_fp8|N=768|K=256"])
def test_calibrated_guard_leave_one_out_never_serves_a_logged_loser(sig, log):
    # each interior measured M dropped from the shipped log, the signature re-partitioned (calibrated guard fitted
    # without it): what it serves there is never slower than torch._scaled_mm by more than 2 % in the log
    # (benchmarks/region_guard_loo.py runs this over every signature)
    import json

    from oasr_ops.tune.build import BuildOptions
    from oasr_ops.tune.from_log import log_tables, partition_logged

    recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    tables, weights, held, _ = log_tables(recs)
    o = BuildOptions(arch="sm90")
    table = tables[sig]
    for m in sorted(table)[1:-1]:
        t = {k: v for k, v in table.items() if k != m}
        w = {k: v for k, v in weights[sig].items() if k != m}
        h = {"validation": set(held[sig]["validation"]) - {m}, "must_tune": set(held[sig]["must_tune"]) - {m},
             "l2": held[sig]["l2"]}
        cfg = served_tile(partition_logged(sig, t, w, h, "sm90", o.min_speedup, o.max_loss)["regions"], m, sig)
        arm = cfg if cfg in table[m] else "torch"
        assert table[m]["torch"][0] / table[m][arm][0] >= 0.98, (m, cfg)


def test_fallback_time_prices_a_launch_floor_gap_at_its_lower_bound():
    from oasr_ops.tune.region_guard import LAUNCH_FLOOR_BAND, fallback_time, interpolated

    pts = [(16, 5.0), (1907, 5.37), (9233, 13.5), (24000, 21.1)]  # torch, N=K=512 (us): flat, then rising
    f, lin = fallback_time(pts), interpolated(pts)
    assert 5.37 / 5.0 <= LAUNCH_FLOOR_BAND < 13.5 / 5.0
    assert lin(3552) == pytest.approx(5.37 + (13.5 - 5.37) * (3552 - 1907) / (9233 - 1907))  # 7.2: overpriced
    assert f(3552) == pytest.approx(5.37)  # max(t0, t1 M / m1) = max(5.37, 5.19)
    assert f(8000) == pytest.approx(13.5 * 8000 / 9233)
    assert f(16000) == lin(16000)  # 9233 is off the floor: the line
    for m in (16, 1907, 9233, 24000, 1, 10 ** 6):  # measured points and outside them: unchanged
        assert f(m) == lin(m)
    assert all(f(m) <= lin(m) for m in range(17, 24000, 97))  # never dearer than the line: the guard only takes Ms


def test_launch_floor_pricing_sends_the_v3_heldout_loser_to_torch(monkeypatch):
    # leave-one-out on the shipped file's log (v3): without M=3552, N=K=512 partitions (1024, 24000] to the heuristic,
    # whose 128x128 2x1 FastAccum tile measured 0.906x of torch._scaled_mm at 3552 (5.54 vs 6.11 us); the line from
    # torch's 5.37 us at M=1907 to 13.5 us at 9233 priced torch at 7.2 us there, so the guard kept it
    import json

    from oasr_ops.tune import region_guard
    from oasr_ops.tune.build import BuildOptions
    from oasr_ops.tune.from_log import log_tables, partition_logged

    sig = "scaled_mm_fp8|op=scaled_mm_fp8|N=512|K=512"
    recs = [json.loads(line) for line in FP8_V3_LOG.read_text().splitlines() if line.strip()]
    tables, weights, held, _ = log_tables(recs)
    o = BuildOptions(arch="sm90")
    table = {k: v for k, v in tables[sig].items() if k != 3552}
    w = {k: v for k, v in weights[sig].items() if k != 3552}
    h = {"validation": set(held[sig]["validation"]), "must_tune": set(held[sig]["must_tune"]) - {3552},
         "l2": held[sig]["l2"]}

    def served() -> str:
        return served_tile(partition_logged(sig, table, w, h, "sm90", o.min_speedup, o.max_loss)["regions"], 3552, sig)
    assert served() == "torch"
    monkeypatch.setattr(region_guard, "fallback_time", lambda pts: region_guard.interpolated(pts))
    assert served() == "t128x128x128_c2x1_pp_fa"  # the straight line (the rule before) kept the loser
