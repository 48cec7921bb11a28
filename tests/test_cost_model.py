"""The cost model, ArchProfile and the calibration fit (CPU; the probe test is GPU-only)."""
from __future__ import annotations

import itertools
import json
import math
import os

import numpy as np
import pytest

from oasr_ops.configs import parse
from oasr_ops.runtime import arch_profile as ap
from oasr_ops.runtime import cost_model as cm
from oasr_ops.tune import calibrate

# A toy GPU: 4 SMs, 64 KiB shared memory per SM, peak and bandwidths large enough that hand-set coefficients
# decide every number (the memory floor is ~0).
TOY = ap.ArchProfile("toy", "sm90", sm_count=4, smem_per_sm_bytes=64 * 1024, l2_bytes=1 << 20, sm_clock_mhz=1000,
                     dram_bw_bytes_s=1e18, peak_ops_s={"fp16": 1e15}, graph_launch_s=1e-6, l2_bw_bytes_s=1e18)
SMALL_2X = "b64x64x32_w32x32x32_s2"  # 16 KiB smem, 4 warps: 4 CTAs per toy SM
COOP = "t128x128x64_c1x1_coop"  # 3.x auto carve-out: 1 CTA per SM


def _cal(**coefs):
    return cm.Calibration("sm90", configs={k: v for k, v in coefs.items()})


# ---------------------------------------------------------------------------------------------- formula

def test_structure_data_parallel_by_hand():
    # M=N=256 on 128x128 tiles: 4 tiles on 4 SMs, one wave; K=256 / 64 = 4 k-iterations.
    st = cm.structure(parse(COOP), 256, 256, 256, "fp16", TOY)
    assert (st.tiles, st.split, st.k_iters, st.waves, st.x_a, st.x_b) == (4, 1, 4, 1, 1, 4)
    # 5 tiles on 4 SMs (1 CTA each): two waves.
    st = cm.structure(parse(COOP), 256, 384, 256, "fp16", TOY)
    assert st.tiles == 6 and st.waves == 2 and st.x_a == 2


def test_partial_wave_ctas_do_not_share_an_sm():
    cfg = parse(SMALL_2X)
    assert cm.ctas_per_sm(cfg, TOY) == 4  # 64 KiB / 16 KiB
    # 3 x 6 = 18 tiles, 16 slots (4 SMs x 4): one full wave (4 CTAs per SM) + 2 CTAs spread one per SM.
    st = cm.structure(cfg, 192, 384, 256, "fp16", TOY)
    assert st.tiles == 18 and st.waves == 2
    assert st.x_a == 4 + 1  # not 4 + 2/16*4: the partial wave costs one whole K-loop on its SMs
    assert st.x_b == 5 * 8  # K=256 / 32 = 8 k-iterations
    # T = x_a*a + x_b*b + R + launch with a=1 us, b=0.1 us, R=2 us, L=1 us -> 5 + 4 + 2 + 1 = 12 us
    t = cm.predict_us(cfg.id, 192, 384, 256, "fp16", TOY, _cal(**{cfg.id: (1e-6, 1e-7, 2e-6)}))
    assert t == pytest.approx(12.0)
    # 2 tiles only: one CTA per SM, one round
    st = cm.structure(cfg, 64, 128, 256, "fp16", TOY)
    assert (st.waves, st.x_a) == (1, 1)
    # 6 CTAs over 4 SMs in the (only, partial) wave: two on some SMs
    st = cm.structure(cfg, 128, 192, 256, "fp16", TOY)
    assert (st.tiles, st.waves, st.x_a) == (6, 1, 2)


def test_split_larger_than_k_tiles_is_infeasible():
    split8 = SMALL_2X + "_k8"
    assert cm.structure(parse(split8), 64, 64, 128, "fp16", TOY) is None  # 128 / 32 = 4 K-tiles < 8
    assert cm.predict_us(split8, 64, 64, 128, "fp16", TOY) == math.inf
    assert split8 not in [c for c, _ in cm.rank([split8, SMALL_2X], 64, 64, 128, "fp16", TOY)]
    st = cm.structure(parse(split8), 64, 64, 256, "fp16", TOY)  # 8 K-tiles: feasible, 1 k-iteration each
    assert (st.split, st.k_iters, st.tiles) == (8, 1, 1)
    assert st.x_a == 2  # 8 CTAs on 4 SMs (4 slots each): one partial wave, 2 per SM
    assert st.red_s > 0


def test_memory_floor_and_launch():
    slow_bw = ap.with_overrides(TOY, dram_bw_bytes_s=1e9)
    m = n = k = 64
    floor = ((m * k + n * k) * 2 + m * n * 2) / 1e9
    t = cm.predict_s(COOP, m, n, k, "fp16", slow_bw, _cal(**{COOP: (0.0, 0.0, 0.0)}))
    assert t == pytest.approx(floor + 1e-6)


def test_cluster_rounds_the_grid_up():
    st = cm.structure(parse("t128x128x64_c2x1_coop"), 128, 128, 64, "fp16", TOY)
    assert st.tiles == 2  # one tile of work, launched as a 2x1 cluster


H200 = ap.reference_profile("sm90")
SM90_IDS = [c.id for c in __import__("oasr_ops.families.gemm.lanes", fromlist=["SM90_SPACE"]).SM90_SPACE]


@pytest.mark.parametrize("cid", SM90_IDS + ["torch"])
def test_monotone_in_m_and_k(cid):
    for n, k in ((256, 256), (1024, 4096), (3072, 1024)):
        ts = [cm.predict_s(cid, m, n, k, "fp16", H200) for m in (1, 8, 64, 200, 1000, 5000, 20000)]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(ts, ts[1:])), (cid, n, k, ts)
        tk = [cm.predict_s(cid, 512, n, kk, "fp16", H200) for kk in (64, 256, 1024, 8192)]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(tk, tk[1:])), (cid, n, tk)


def test_torch_curve_is_monotone():
    c = cm.TorchCurve.from_dict(cm.DEFAULT_TORCH_CURVE)
    effs = [c.eff(m, 1024, 1024) for m in (1, 16, 256, 4096, 65536)]
    assert effs == sorted(effs) and 0 < effs[0] and effs[-1] <= c.e_max


# ---------------------------------------------------------------------------------------------- choose

def test_choose_answers_torch_unless_a_config_beats_the_gate():
    m, n, k = 512, 512, 512
    t_torch = cm.predict_s("torch", m, n, k, "fp16", TOY)
    launch = TOY.graph_launch_s
    # a config whose time is t_torch / 1.01: faster, but not by the 2 % gate
    near = _cal(**{COOP: (0.0, 0.0, t_torch / 1.01 - launch)})
    assert cm.choose([COOP], m, n, k, "fp16", TOY, near, gate=0.02) == "torch"
    assert cm.choose([COOP], m, n, k, "fp16", TOY, near, gate=0.0) == COOP
    far = _cal(**{COOP: (0.0, 0.0, t_torch / 1.05 - launch)})
    assert cm.choose([COOP, "torch"], m, n, k, "fp16", TOY, far, gate=0.02) == COOP
    assert cm.choose([], m, n, k, "fp16", TOY) == "torch"
    # only infeasible candidates: torch
    assert cm.choose([SMALL_2X + "_k8"], 64, 64, 128, "fp16", TOY) == "torch"


def test_rank_sorted_and_activation_costs_torch_more():
    r = cm.rank(SM90_IDS + ["torch"], 4096, 1024, 1024, "fp16", H200)
    assert [t for _, t in r] == sorted(t for _, t in r) and len(r) == len(SM90_IDS) + 1
    assert (cm.predict_s("torch", 4096, 1024, 1024, "fp16", H200, activation=True)
            > cm.predict_s("torch", 4096, 1024, 1024, "fp16", H200))


# ---------------------------------------------------------------------------------------------- calibration

def test_calibration_json_round_trip():
    cal = cm.Calibration("sm90", "fp16", configs={COOP: (1e-6, 2e-7, 3e-6)},
                         torch=cm.TorchCurve(-9.0, 0.4, 0.2, 1e-6, 0.7, 0.6), structure=(1.2, 0.9, 5e-7),
                         sku="NVIDIA H200", meta={"points": 3})
    back = cm.from_json(json.loads(json.dumps(cm.to_json(cal))))
    assert back == cal
    assert cm.predict_s(COOP, 300, 700, 900, "fp16", H200, back) == cm.predict_s(COOP, 300, 700, 900, "fp16", H200,
                                                                                   cal)


@pytest.mark.parametrize("bad", [None, [], {"kind": "x"}, {"kind": cm.MODEL_KIND, "version": 99},
                                 {"kind": cm.MODEL_KIND, "version": 1, "arch_family": "sm90",
                                  "configs": {"not_an_id": [0, 0, 0]}},
                                 {"kind": cm.MODEL_KIND, "version": 1, "arch_family": "sm90",
                                  "configs": {COOP: [-1, 0, 0]}},
                                 {"kind": cm.MODEL_KIND, "version": 1, "configs": {}}])
def test_from_json_rejects_junk(bad):
    with pytest.raises(ValueError):
        cm.from_json(bad)


def test_nnls_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        a, b = rng.normal(size=(12, 3)), rng.normal(size=12)
        x = calibrate.nnls(a, b)
        assert (x >= 0).all()
        best = math.inf
        for keep in itertools.product([0, 1], repeat=3):  # every active set: the constrained optimum is one
            idx = [i for i in range(3) if keep[i]]
            z = np.zeros(3)
            if idx:
                z[idx] = np.linalg.lstsq(a[:, idx], b, rcond=None)[0]
            if (z >= 0).all():
                best = min(best, float(np.linalg.norm(a @ z - b)))
        assert np.linalg.norm(a @ x - b) == pytest.approx(best, rel=1e-9, abs=1e-12)


def _synthetic_log(profile, coefs, curve, sigs):
    cal = cm.Calibration("sm90", configs=coefs, torch=curve)
    recs = []
    for (n, k) in sigs:
        for m in (8, 48, 256, 1000, 4096, 16384):
            for cid in list(coefs) + ["torch"]:
                t = cm.predict_s(cid, m, n, k, "fp16", profile, cal)
                recs.append({"signature": f"gemm|op=gemm|dt=half|N={n}|K={k}", "m": m, "config": cid,
                             "median_s": t, "weight": 1.0})
    return recs


def test_fit_recovers_known_coefficients():
    coefs = {COOP: (0.9e-6, 0.31e-6, 1.7e-6), "t64x64x64_c1x1_pp": (0.4e-6, 0.12e-6, 0.5e-6),
             "t128x128x64_c1x1_sk": (1.1e-6, 0.33e-6, 2.5e-6)}
    # a curve on the fit's grid (overhead 0.4 us, e_max 0.7, bw_eff 0.5), so it is recoverable exactly
    curve = cm.TorchCurve(-12.0, 0.5, 0.4, 0.4e-6, 0.7, 0.5)
    recs = _synthetic_log(H200, coefs, curve, [(256, 256), (1024, 1024), (3072, 1024), (1024, 8192), (512, 2048)])
    cal = calibrate.fit(recs, H200)
    for cid, want in coefs.items():
        assert cal.configs[cid] == pytest.approx(want, rel=1e-6)
    for m, n, k in ((8, 1024, 1024), (3000, 3072, 1024), (16384, 512, 2048)):
        assert cm.predict_s("torch", m, n, k, "fp16", H200, cal) == pytest.approx(
            cm.predict_s("torch", m, n, k, "fp16", H200, cm.Calibration("sm90", torch=curve)), rel=0.02)
    # an exact model has zero regret against its own data
    r = calibrate.model_regret(recs, cal, H200, gate=0.0)
    assert r["n"] == 30 and r["max"] == pytest.approx(0.0, abs=1e-9)
    assert r["picks"]["torch"] + r["picks"]["cutlass"] == 30


def test_fit_table_prices_one_signatures_tiles_from_its_own_points():
    """calibrate.fit_table (the fp8 wave guard's per-signature fit): times made by the model with known (a, b, R)
    at one (N, K) are predicted back exactly at other Ms; torch and sentinels are not fitted; a tile with fewer
    than three points gets nothing."""
    coefs = {"t128x128x128_c2x1_pp_fa": (0.9e-6, 0.02e-6, 1.2e-6), "t64x16x256_c1x1_pp_fa_swab": (0.3e-6, 0.05e-6,
                                                                                                   0.4e-6)}
    cal = cm.Calibration("sm90", "fp8", configs=coefs)
    n, k = 2048, 512
    table = {m: {cid: cm.predict_s(cid, m, n, k, "fp8", H200, cal) for cid in coefs}
             for m in (15, 80, 512, 1907, 3552, 9233, 24000)}
    for m in table:
        table[m]["torch"] = 1e-5
        table[m]["heuristic"] = 1e-5
    table[15]["t64x64x256_c1x1_pp_swab"] = 4e-6
    table[80]["t64x64x256_c1x1_pp_swab"] = 4e-6
    fitted = calibrate.fit_table(table, n, k, "fp8", H200)
    assert set(fitted) == set(coefs)
    fcal = cm.Calibration("sm90", "fp8", configs=fitted)
    for cid in coefs:
        for m in (1, 300, 4097, 6000, 20000):  # never fitted there
            assert cm.predict_s(cid, m, n, k, "fp8", H200, fcal) == pytest.approx(
                cm.predict_s(cid, m, n, k, "fp8", H200, cal), rel=1e-6)


def test_model_regret_on_the_h200_log_runs():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "logs", "sm90_gemm_build.jsonl")
    if not os.path.exists(path):
        pytest.skip("no H200 build log in this checkout")
    recs = calibrate.read_log(path)
    points = len({(r["signature"], r["m"]) for r in recs})  # the shipped log's distinct measured points
    cal = calibrate.fit(recs, H200, configs=False)
    assert cal.torch is not None and cal.structure is not None and cal.meta["points"] == points
    r = calibrate.model_regret(recs, cal, H200)
    assert r["n"] == points and 0.0 <= r["geomean"] <= r["max"]


# ---------------------------------------------------------------------------------------------- profiles

def test_static_table():
    h = ap.reference_profile("sm90")
    assert h.sku == "NVIDIA H200" and h.sm_count == 132 and h.dram_bw_bytes_s == 4.8e12
    assert h.peak("fp16") == pytest.approx(989e12) and h.peak("int8") == pytest.approx(1979e12)
    assert h.peak("half") == h.peak("fp16")
    assert ap.reference_profile("9.0a") is h and ap.reference_profile("sm_90") is h
    expect = {"sm80": "A100", "sm89": "L40S", "sm90": "H200", "sm100": "B200", "sm120": "RTX 5090"}
    for fam, part in expect.items():
        p = ap.reference_profile(fam)
        assert part in p.sku and p.arch_family == fam
    assert "H100" in ap.static_profile("NVIDIA H100 80GB HBM3").sku
    assert ap.static_profile("NVIDIA H200 NVL").sku == "NVIDIA H200"
    assert ap.static_profile("Some Other GPU") is None
    with pytest.raises(ValueError):
        ap.reference_profile("sm75")
    with pytest.raises(ValueError):
        ap.reference_profile("banana")
    with pytest.raises(ValueError):
        ap.reference_profile("sm80").peak("fp8")  # A100 has no fp8 tensor path


def test_current_profile_without_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ap.current_profile("sm100").sku == "NVIDIA B200"
    with pytest.raises(ValueError):
        ap.current_profile()


def test_profile_dict_round_trip():
    for p in ap.STATIC_PROFILES.values():
        assert ap.ArchProfile.from_dict(json.loads(json.dumps(p.to_dict()))) == p
        hash(p)
    with pytest.raises(ValueError):
        ap.ArchProfile.from_dict({"sku": "x"})


def test_cache_write_is_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = ap._cache_path("NVIDIA H200", "13.0", "2.13.0+cu130")
    assert str(path).startswith(str(tmp_path))
    h = ap.reference_profile("sm90")
    ap.write_cached(path, h)
    assert ap.read_cached(path) == h
    # a writer that dies mid-write leaves the previous file intact and no temp file behind
    other = ap.with_overrides(h, sm_count=1)

    def boom(*a, **k):
        raise OSError("disk full")

    from oasr_ops import paths

    monkeypatch.setattr(paths.os, "fsync", boom)  # dies after writing the temp file, before the rename
    with pytest.raises(OSError):
        ap.write_cached(path, other)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ap.read_cached(path) == h
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, path.name + ".lock"])
    path.write_text("{not json")
    assert ap.read_cached(path) is None


@pytest.mark.parametrize("field,value", [("sm_count", "Infinity"), ("sm_count", "-4"), ("sm_clock_mhz", "NaN"),
                                         ("dram_bw_bytes_s", "0"), ("graph_launch_s", "-1e-6")])
def test_a_cached_profile_out_of_range_is_reprobed_not_served(tmp_path, field, value):
    """A cached profile is data a cost model divides by: a value out of range (int(Infinity) raised
    OverflowError past every handler) makes it unreadable, so it is probed again."""
    import json

    path = tmp_path / "p.json"
    d = ap.reference_profile("sm90").to_dict()
    text = json.dumps(d).replace(f'"{field}": {json.dumps(d[field])}', f'"{field}": {value}')
    assert text != json.dumps(d)
    path.write_text(text)
    assert ap.read_cached(path) is None
    path.write_bytes(b"\xff" + json.dumps(d).encode())
    assert ap.read_cached(path) is None


@pytest.mark.gpu
def test_probe_writes_cache(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    p = ap.probe_profile(use_cache=False)
    props = torch.cuda.get_device_properties(0)
    assert p.source == "probe" and p.sm_count == props.multi_processor_count and p.sku == props.name
    assert p.peak("fp16") > 1e13 and p.dram_bw_bytes_s > 1e11 and 0 < p.graph_launch_s < 1e-4
    files = list((tmp_path / "oasr" / "arch_profile").glob("*.json"))
    assert len(files) == 1 and ap.read_cached(files[0]) == p
    assert ap.probe_profile() == p  # cached


def test_calibrate_tool_on_a_log_of_another_family_is_an_error_not_a_traceback(tmp_path, capsys):
    """`python -m oasr_ops.tune.calibrate` fits the gemm family's model; a conv1d build's log used to end in a
    TypeError from deep in the ranking; nothing is written then."""
    from oasr_ops.tune.calibrate import main

    log = tmp_path / "conv1d.jsonl"
    log.write_text(json.dumps({"signature": "conv1d|op=conv1d_btc|dt=half|N=512|K=15872", "m": 64,
                               "config": "dw128x32_v8_n256", "median_s": 1e-5}) + "\n5\n")
    out = tmp_path / "cal.json"
    assert main([str(log), "--arch", "sm90", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no record of the gemm family" in err and "Traceback" not in err and not out.exists()
