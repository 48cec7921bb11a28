"""The wave guard (tune/region_guard.py): stretches of a CUTLASS region past a wave edge go to the fallback."""
from __future__ import annotations

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
    ("scaled_mm|op=scaled_mm|N=1024|K=1024", False),
    ("not a signature", False),
])
def test_ratio_only_for_modelled_families(sig, modelled):
    assert (ratio_for_signature(sig, "sm90") is not None) == modelled
