import json
import math

import pytest

from oasr_ops.tune import evaluate as ev

S1 = "gemm|op=gemm|dt=half|N=512|K=256"
S2 = "gemm|op=gemm|dt=half|N=1024|K=256"


def rec(sig, m, cfg, t, w):
    return {"signature": sig, "m": m, "config": cfg, "median_s": t, "sigma_s": None if t is None else t / 100, "n": 9, "weight": w}


LOG = [
    # S1, M=64 (weight 1): oracle A (1.0)
    rec(S1, 64, "default", 2.0, 1.0), rec(S1, 64, "torch", 1.5, 1.0), rec(S1, 64, "A", 1.0, 1.0),
    # S1, M=128 (weight 3): oracle B (1.6); A's first measurement is superseded by the later record
    rec(S1, 128, "default", 3.0, 3.0), rec(S1, 128, "torch", 2.0, 3.0), rec(S1, 128, "A", 9.9, 3.0),
    rec(S1, 128, "B", 1.6, 3.0), rec(S1, 128, "A", 2.5, 3.0),
    # S2, M=64 (weight 2): default and torch tie at the oracle; a failed arm is ignored
    rec(S2, 64, "default", 1.0, 2.0), rec(S2, 64, "torch", 1.0, 2.0), rec(S2, 64, "A", 1.1, 2.0),
    rec(S2, 64, "broken", None, 2.0),
]


def wgeo(pairs):
    """Weighted geomean regret from (weight, regret) pairs, by hand."""
    return math.exp(sum(w * math.log(1 + r) for w, r in pairs) / sum(w for w, _ in pairs)) - 1


def test_constant_selectors_known_regrets():
    res = ev.evaluate(LOG, {"default": ev.constant_selector("default"), "torch": ev.constant_selector("torch")})
    assert res["points"] == 3
    d = res["selectors"]["default"]
    # regrets: 2.0/1.0-1 = 1.0, 3.0/1.6-1 = 0.875, 0
    # points are ordered by (signature, m): S2 ("N=1024") sorts before S1 ("N=512")
    assert [(p.signature, p.m) for p in d.points] == [(S2, 64), (S1, 64), (S1, 128)]
    assert [p.regret for p in d.points] == [0.0, pytest.approx(1.0), pytest.approx(0.875)]
    assert [p.oracle for p in d.points] == ["default", "A", "B"]
    assert d.n == 3 and d.unmeasured == 0 and d.uncovered == 0
    assert d.geomean == pytest.approx(wgeo([(1, 1.0), (3, 0.875), (2, 0.0)]))
    assert d.geomean == pytest.approx(0.536994, abs=1e-6)
    assert d.p95 == pytest.approx(1.0) and d.max == pytest.approx(1.0)
    t = res["selectors"]["torch"]
    assert [p.regret for p in t.points] == [0.0, pytest.approx(0.5), pytest.approx(0.25)]
    assert t.geomean == pytest.approx(wgeo([(1, 0.5), (3, 0.25), (2, 0.0)]))


def test_db_selectors_round_up_unmeasured_and_uncovered():
    good = {"entries": {S1: {"regions": [[64, "A"], [None, "B"]]}}}
    unmeas = {S1: {"regions": [[100, "C"], [None, "A"]]}}  # C was never measured
    res = ev.evaluate(LOG, {"good": good, "unmeas": unmeas, "fn": lambda sig, m: "A"})
    g = res["selectors"]["good"]
    # S2 has no entry: uncovered (miss=None), left out of the statistics.
    assert (g.n, g.unmeasured, g.uncovered) == (2, 0, 1)
    assert (g.geomean, g.p95, g.max) == (0.0, 0.0, 0.0)
    u = res["selectors"]["unmeas"]
    assert (u.n, u.unmeasured, u.uncovered) == (1, 1, 1)
    assert u.geomean == pytest.approx(2.5 / 1.6 - 1)
    assert [(p.config, p.regret) for p in u.points] == [(None, None), ("C", None), ("A", pytest.approx(0.5625))]
    f = res["selectors"]["fn"]
    # A: 0, 2.5/1.6-1 = 0.5625, 1.1/1.0-1 = 0.1; p95 by nearest rank of 3 points = the max
    assert f.geomean == pytest.approx(wgeo([(1, 0.0), (3, 0.5625), (2, 0.1)]))
    assert (f.p95, f.max) == (pytest.approx(0.5625), pytest.approx(0.5625))
    # A DB selector with a miss config: S2 gets the default there (regret 0 at S2/64).
    g2 = ev.evaluate(LOG, {"good": good}, miss="default")["selectors"]["good"]
    assert (g2.n, g2.uncovered, g2.geomean) == (3, 0, 0.0)


def test_dtype_alias_and_no_catch_all():
    log = [rec("gemm|op=gemm|dt=fp16|N=8|K=8", 64, "A", 1.0, 1.0), rec("gemm|op=gemm|dt=fp16|N=8|K=8", 64, "B", 2.0, 1.0),
           rec("gemm|op=gemm|dt=fp16|N=8|K=8", 256, "A", 1.0, 1.0)]
    half = {"gemm|op=gemm|dt=half|N=8|K=8": {"regions": [[64, "B"]]}}  # autotune-style: no catch-all
    s = ev.evaluate(log, {"h": half})["selectors"]["h"]
    assert [p.config for p in s.points] == ["B", None]
    assert (s.n, s.uncovered, s.geomean) == (1, 1, pytest.approx(1.0))
    exact = {**half, "gemm|op=gemm|dt=fp16|N=8|K=8": {"regions": [[None, "A"]]}}  # fp16 entry wins over half
    assert [p.config for p in ev.evaluate(log, {"e": exact})["selectors"]["e"].points] == ["A", "A"]
    # An fp16 entry not covering M falls through to the half entry.
    partial = {**half, "gemm|op=gemm|dt=fp16|N=8|K=8": {"regions": [[32, "A"]]}}
    assert [p.config for p in ev.evaluate(log, {"p": partial})["selectors"]["p"].points] == ["B", None]


def test_p95_nearest_rank_and_unit_weights():
    log = [rec(S1, m, c, t, None) for m in range(1, 21) for c, t in (("o", 1.0), ("s", 1.0 + m / 100))]
    s = ev.evaluate(log, {"s": ev.constant_selector("s")})["selectors"]["s"]
    # regrets 0.01 .. 0.20; nearest rank ceil(0.95 x 20) = 19th -> 0.19; no weights: plain geomean
    assert s.p95 == pytest.approx(0.19) and s.max == pytest.approx(0.20)
    assert s.geomean == pytest.approx(wgeo([(1, m / 100) for m in range(1, 21)]))


def test_format_table():
    res = ev.evaluate(LOG, {"default": ev.constant_selector("default")})
    lines = ev.format_table(res).splitlines()
    assert lines[0].split() == ["selector", "points", "geomean", "p95", "max", "unmeasured", "uncovered"]
    assert lines[2].split() == ["default", "3", "53.7%", "100.0%", "100.0%", "0", "0"]


def _cli(argv):
    from oasr_ops import cli

    return cli.main(["tune", *argv])  # the CLI's one error path: UsageError -> one line, exit 2


def test_cli_json(tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in LOG) + "\n\n")
    db = tmp_path / "gemm.json"
    db.write_text(json.dumps({"entries": {S1: {"regions": [[64, "A"], [None, "B"]]}}}))
    assert _cli(["evaluate", "--log", str(log), "--db", f"new={db}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 3
    assert list(out["selectors"]) == ["new", "default", "torch"]
    # --miss default (the CLI's default): S2 falls to the default arm, regret 0 there.
    assert out["selectors"]["new"]["geomean"] == 0.0 and out["selectors"]["new"]["uncovered"] == 0
    assert out["selectors"]["default"]["geomean"] == pytest.approx(0.536994, abs=1e-6)
    assert _cli(["evaluate", "--log", str(log), "--db", f"new={db}", "--miss", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["selectors"]["new"]["uncovered"] == 1


def test_cli_table_plot_and_errors(tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in LOG))
    png = tmp_path / "r.png"
    try:
        import matplotlib  # noqa: F401
        assert _cli(["evaluate", "--log", str(log), "--plot", str(png)]) == 0
        cap = capsys.readouterr()
        assert cap.out.splitlines()[0].split()[0] == "selector" and png.exists()
    except ImportError:  # a plot that cannot be written is an error, not a silent exit 0 (tests/test_cli.py)
        assert _cli(["evaluate", "--log", str(log), "--plot", str(png)]) == 2
        assert "pip install oasr_ops[plot]" in capsys.readouterr().err and not png.exists()
    assert _cli(["evaluate", "--log", str(log)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == "selector"
    assert _cli(["evaluate", "--log", str(log), "--db", "nopath"]) == 2
    assert "NAME=PATH" in capsys.readouterr().err
    assert _cli(["evaluate", "--log", str(tmp_path / "missing.jsonl")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert _cli(["evaluate", "--log", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
