"""The traced census: keys, traffic weights, symbolic traces checked against concrete ones, capture merge, CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from examples import conformer, whisper
from oasr_ops.inductor.capture import GemmRecorder, read_capture, write_counts
from oasr_ops.tune import census as C
from oasr_ops.tune.census_model import build_for_census

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "manifests" / "librispeech_like_200.jsonl"
FFN1 = "gemm|op=gemm_activation|dt=half|N=1024|K=256"   # Conformer S: Linear(d, 4d) + SiLU
FFN2 = "gemm|op=gemm|dt=half|N=256|K=1024"
DW = "conv1d|op=conv1d_btc|dt=half|N=256|K=31"     # the depthwise conv of the convolution module


@pytest.fixture(scope="module")
def conformer_census():
    model = build_for_census(conformer.build_model, {"size": "S", "dtype": "bf16", "num_layers": "2"})
    durations = C.read_manifest(MANIFEST)
    c = C.census_for_model(model, conformer.census_info, service_mode="offline", max_batch_size=32,
                           durations=durations)
    return c, c.to_json(), durations


def test_offline_keys_replay_length_sorted_batches():
    keys = C.offline_keys([1.0, 2.0, 3.05, 9.6, 0.5], 2, time_granularity=64)
    assert C.batch_buckets(2) == [1, 2] and C.batch_buckets(24) == [1, 2, 4, 8, 16, 24]
    traffic = {(k.batch, k.frames): k.traffic for k in keys if k.traffic}
    # sorted: 960, 305 | 200, 100 | 50 frames -> (2, 960) (2, 256) (1, 64)
    assert traffic == {(2, 960): 1, (2, 256): 1, (1, 64): 1}
    assert {k.frames for k in keys} == set(range(64, 961, 64)) and len(keys) == 2 * 15
    fixed = C.offline_keys([1.0, 29.0, 40.0], 4, fixed_window=3000, time_granularity=64)
    assert {k.frames for k in fixed} == {3000}  # exactly the window, never rounded to 3008


def test_streaming_keys_and_default_histogram():
    h = C.default_concurrency(32)
    assert abs(sum(h.values()) - 1) < 1e-9 and max(h, key=h.get) in (7, 8) and h[32] < 1e-6
    keys = C.streaming_keys(8, C.chunk_input_frames(16, 4), steps=1000)
    assert [k.batch for k in keys] == list(range(1, 9)) and {k.frames for k in keys} == {67}
    assert abs(sum(k.traffic for k in keys) - 1000) < 1e-6
    assert conformer.output_frames(67) == 16


def test_limit_keys_keeps_traffic_first():
    keys = [C.Key(b, t, 1.0 if (b, t) == (4, 640) else 0.0) for b in (1, 2, 4) for t in range(64, 1025, 64)]
    kept = C.limit_keys(keys, 5)
    assert len(kept) == 5 and C.Key(4, 640, 1.0) in kept


def test_conformer_census_signatures_and_weights(conformer_census):
    c, doc, durations = conformer_census
    sigs = doc["signatures"]
    d = 256
    assert set(sigs) == {FFN1, FFN2, "gemm|op=gemm|dt=half|N=768|K=256", "gemm|op=gemm|dt=half|N=256|K=256",
                         "gemm|op=gemm|dt=half|N=512|K=256", "gemm|op=gemm|dt=half|N=256|K=4864",
                         # the convolution module's depthwise nn.Conv1d (d channels, kernel 31) on [B, T, C]
                         # activations: the conv1d family's rewrite handler records it like any site
                         DW,
                         # the Conv2dSubsampling frontend's two 3x3 stride-2 convs (conv2d_activation family)
                         "conv2d_activation|op=conv2d_k3s2|dt=half|N=256|K=9",
                         "conv2d_activation|op=conv2d_k3s2|dt=half|N=256|K=2304"}
    assert (sigs[FFN1]["n"], sigs[FFN1]["k"]) == (4 * d, d) and sigs[FFN1]["dtypes"] == ["bf16"]
    pts = {p["m"]: p for p in sigs[FFN1]["points"]}
    assert all(p["must_tune"] for p in pts.values())
    assert abs(sum(p["weight"] for s in sigs.values() for p in s["points"]) - 1) < 1e-9
    # Replay by hand: the longest-first batches of 32 and their keys.
    frames = sorted((round(x * 100) for x in durations), reverse=True)
    expect: dict[int, int] = {}
    for i in range(0, len(frames), 32):
        batch = frames[i:i + 32]
        b = next(x for x in (1, 2, 4, 8, 16, 32) if x >= len(batch))
        t = -(-batch[0] // 64) * 64
        m = b * conformer.output_frames(t)
        expect[m] = expect.get(m, 0) + 2 * 2  # 2 layers x 2 FFNs (macaron)
    assert {m: p["calls"] for m, p in pts.items() if p["calls"]} == expect
    # A key with traffic 0 still reaches must-tune points (every key is captured).
    assert pts[1 * conformer.output_frames(64)]["calls"] == 0
    assert c.info["traces"] <= 3 and doc["time_granularity"] == 64


def test_symbolic_trace_matches_concrete_trace(conformer_census):
    model = build_for_census(conformer.build_model, {"size": "S", "dtype": "bf16", "num_layers": "2"})
    make, dims = C.input_maker(model, conformer.census_info)
    tracer = C.ModelTracer(model, make, dims)
    params = list(tracer.params.values())
    for b, t in [(3, 320), (1, 128), (32, 3008)]:
        got = sorted((s.signature, s.m) for s in tracer.sites(b, t))
        res, _, _ = C.trace_sites(tracer._fn, [*params, make(b, t)])  # all static: a concrete trace
        want = sorted((s.signature.replace("dt=bf16", "dt=half"), s.m) for s in res.sites)
        assert got == want and got
    assert len(tracer.traces) == 2  # B >= 2 symbolic, B = 1 specialised


def test_whisper_census_keys_at_the_fixed_window():
    model = build_for_census(whisper.build_model, {"size": "tiny", "num_layers": "1"})
    c = C.census_for_model(model, whisper.census_info, service_mode="offline", max_batch_size=4,
                           durations=[5.0, 12.0, 31.0])
    doc = c.to_json()
    assert {k["frames"] for k in doc["keys"]} == {3000}
    ms = {p["m"] for p in doc["signatures"]["gemm|op=gemm|dt=half|N=384|K=384"]["points"]}
    assert ms == {1500, 3000, 6000}  # B in {1, 2, 4} x 1500 positions


def test_streaming_census_cohort_widths():
    model = build_for_census(conformer.build_model, {"size": "S", "dtype": "fp16", "num_layers": "1"})
    c = C.census_for_model(model, conformer.census_info, service_mode="streaming", max_batch_size=8,
                           chunk_size=16)
    doc = c.to_json()
    pts = doc["signatures"][FFN1]["points"]
    assert [p["m"] for p in pts] == [16 * w for w in range(1, 9)] and doc["signatures"][FFN1]["dtypes"] == ["fp16"]
    assert all(p["must_tune"] for p in pts)


def test_capture_merge(tmp_path, conformer_census):
    import oasr_ops

    w = torch.randn(1024, 256, dtype=torch.bfloat16)
    with GemmRecorder() as rec:
        for m in (7, 7, 5000):
            oasr_ops.gemm(torch.randn(m, 256, dtype=torch.bfloat16), w, None, "silu")
    cap = tmp_path / "cap.jsonl"
    write_counts(cap, rec.counts)
    write_counts(cap, rec.counts)  # a second flush adds up
    assert {(r["m"], r["calls"]) for r in read_capture(cap)} == {(7, 4), (5000, 2)}
    c, _doc, _ = conformer_census
    import copy

    c2 = copy.deepcopy(c)
    m_key = next(m for m, p in c2.points[FFN1].items() if p["calls"])
    write_counts(cap, {(FFN1, "bf16", m_key): 4})
    assert C.merge_capture(c2, cap) == 3
    pts = {p["m"]: p for p in c2.to_json()["signatures"][FFN1]["points"]}
    assert pts[7] == {**pts[7], "calls": 4, "must_tune": False, "eager_fraction": 1.0}
    base = c.points[FFN1][m_key]["calls"]
    assert pts[m_key]["must_tune"] and abs(pts[m_key]["eager_fraction"] - 4 / (base + 4)) < 1e-9


def test_capture_merge_skips_records_it_cannot_read(tmp_path):
    """The recorder's merge never fails on a damaged file: torn, non-UTF-8, or wrongly typed records are
    dropped, the good ones summed, the file's mode kept."""
    sig = "gemm|op=gemm|dt=half|N=64|K=32"
    cap = tmp_path / "cap.jsonl"
    good = {"signature": sig, "dtype": "fp16", "m": 3, "calls": 2}
    bad = [{"signature": sig, "dtype": {}, "m": 3}, {"signature": sig, "dtype": None, "m": 4},
           {"signature": sig, "m": 5, "calls": "x"}, {"signature": sig, "m": -1}, {"signature": "nope", "m": 1}]
    lines = [json.dumps(good).encode()] + [json.dumps(b).encode() for b in bad] + [b"\xff\xfe{", b'{"sig']
    cap.write_bytes(b"\n".join(lines) + b"\n")
    cap.chmod(0o600)
    write_counts(cap, Counter({(sig, "fp16", 3): 1, (sig, "fp16", 9): 1}))
    assert sorted((r["m"], r["calls"]) for r in read_capture(cap)) == [(3, 3), (9, 1)]
    assert cap.stat().st_mode & 0o777 == 0o600


def test_capture_flush_to_an_unwritable_path_keeps_the_counts(tmp_path, monkeypatch):
    from oasr_ops.inductor import capture

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rec = GemmRecorder()
    key = ("gemm|op=gemm|dt=half|N=64|K=32", "fp16", 3)
    rec.counts[key] = 2
    monkeypatch.setattr(capture, "_installed", rec)
    monkeypatch.setattr(capture, "_path", blocker / "cap.jsonl")
    monkeypatch.setattr(capture, "_WARN", capture.WarnOnce())
    with pytest.warns(RuntimeWarning, match="cannot write the capture"):
        capture.flush()
    assert rec.counts[key] == 2  # kept for the next flush
    monkeypatch.setattr(capture, "_path", tmp_path / "cap.jsonl")
    capture.flush()
    assert [(r["m"], r["calls"]) for r in read_capture(tmp_path / "cap.jsonl")] == [(3, 2)] and not rec.counts


def test_capture_env_records_eager_calls(tmp_path):
    cap = tmp_path / "env_cap.jsonl"
    code = ("import torch, oasr_ops\n"
            "w = torch.randn(64, 32, dtype=torch.float16)\n"
            "for m in (3, 3, 9): oasr_ops.gemm(torch.randn(m, 32, dtype=torch.float16), w)\n")
    env = {**os.environ, "OASR_CAPTURE_GEMM": str(cap), "OASR_TUNE_USER_DB": "off"}
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_capture(cap)
    assert {(x["signature"], x["m"], x["calls"]) for x in recs} == {("gemm|op=gemm|dt=half|N=64|K=32", 3, 2),
                                                                    ("gemm|op=gemm|dt=half|N=64|K=32", 9, 1)}


def test_cli_census(tmp_path):
    from oasr_ops import cli

    man = tmp_path / "m.jsonl"
    man.write_text("".join(json.dumps({"duration": d}) + "\n" for d in (2.0, 3.3, 4.1, 1.2, 6.0)))
    cap = tmp_path / "cap.jsonl"
    cap.write_text(json.dumps({"signature": "gemm|op=gemm|dt=half|N=256|K=1024", "dtype": "fp16", "m": 3,
                               "calls": 10}) + "\n")
    out = tmp_path / "offline.json"
    rc = cli.main(["tune", "census", "--model", "examples.conformer:build_model", "--model-args", "size=S",
                   "num_layers=1", "--service-mode", "offline", "--max-batch-size", "4", "--manifest", str(man),
                   "--capture", str(cap), "--max-keys", "8", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert len(doc["keys"]) == 8 and doc["model_args"] == {"size": "S", "num_layers": "1"}
    assert FFN1 in doc["signatures"] and doc["signatures"][FFN1]["dtypes"] == ["fp16"]
    p3 = next(p for p in doc["signatures"][FFN2]["points"] if p["m"] == 3)
    assert p3["eager_fraction"] == 1.0 and not p3["must_tune"]


def test_prewarm_from_census_points(tmp_path, monkeypatch, conformer_census):
    import oasr_ops
    from oasr_ops import paths

    monkeypatch.setenv("OASR_ARCH", "sm90")
    monkeypatch.setenv("OASR_TUNE_USER_DB", "off")
    monkeypatch.setattr(paths, "system_db_dir", lambda: tmp_path / "system")  # not the shipped DB: nothing covered
    from oasr_ops.tune import database

    database.reload()
    try:
        _c, doc, _ = conformer_census
        with pytest.raises(oasr_ops.UncoveredPointsError, match="must-tune"):
            oasr_ops.prewarm(None, (), oasr_ops.TuningConfig(strict=True), census=doc)
    finally:
        monkeypatch.undo()
        database.reload()


def test_census_points_come_from_each_familys_recorder(monkeypatch):
    """families/graph.py's census contract: the default is one dt=half point per site; bmm's recorder gives none
    (counted under not_censused); a family's own `census` handler replaces the default."""
    from torch import nn

    from oasr_ops.families.graph import CensusPoint, GemmSite, census_points
    from oasr_ops.runtime import registry

    g = GemmSite("gemm|op=gemm|dt=bf16|N=64|K=32", "gemm", "gemm", "bf16", 64, 32, 16)
    assert census_points(g) == [CensusPoint("gemm|op=gemm|dt=half|N=64|K=32", "gemm", "gemm", "bf16", 64, 32, 16)]

    class Att(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(64, 64)

        def forward(self, x):
            q = self.q(x)
            return q @ q.transpose(1, 2)  # aten.bmm [B, 16, 64] x [B, 64, 16]: rewritten, not censused

    model = Att().to(torch.bfloat16)
    tracer = C.ModelTracer(model, lambda b, t: ((b, t, 64), torch.bfloat16, torch.device("cpu")), (0, None))
    c = C.run_census(tracer, [C.Key(2, 16, 1.0), C.Key(4, 16, 1.0)], "offline")
    doc = c.to_json()
    assert list(doc["signatures"]) == ["gemm|op=gemm|dt=half|N=64|K=64"]
    assert [p["m"] for p in doc["signatures"]["gemm|op=gemm|dt=half|N=64|K=64"]["points"]] == [32, 64]
    assert doc["not_censused"] == {"bmm": 1}  # one trace (B symbolic), one bmm site in it

    def twice(site):  # a recorder with its own point form: two calls per site at M and 2M
        return [CensusPoint("gemm|op=gemm|dt=half|N=64|K=64", "gemm", "gemm", site.dtype, 64, 64, m)
                for m in (site.m_expr, 2 * site.m_expr)]

    monkeypatch.setitem(registry.get("gemm").handlers, "census", twice)
    tracer = C.ModelTracer(model, lambda b, t: ((b, t, 64), torch.bfloat16, torch.device("cpu")), (0, None))
    pts = C.run_census(tracer, [C.Key(2, 16, 1.0)], "offline").to_json()["signatures"]
    assert [p["m"] for p in pts["gemm|op=gemm|dt=half|N=64|K=64"]["points"]] == [32, 64]


def test_every_shipped_census_passes_the_readers_check():
    """The example censuses the shipped DBs were built from (benchmarks/census/) are what users copy: each passes
    `check_census` (tune/census_file.py), the check every reader of a census applies."""
    from pathlib import Path

    from oasr_ops.tune.census_file import check_census

    files = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "census").rglob("*.json"))
    assert len(files) >= 7
    for f in files:
        doc = check_census(f)
        assert doc["signatures"], f


def test_trace_sites_keeps_a_weight_s_requires_grad():
    """matmul folds a transposed 3-D input into an mm (a GEMM site) when the weight requires grad, as a parameter
    does even under no_grad, and keeps a bmm when not: a (shape, dtype, device) stand-in lost the flag, so the
    cache-hit report and the backend's prewarm points saw a bmm where the compile has a GEMM."""
    def fn(x, w):
        return torch.nn.functional.linear(x.transpose(1, 2), w)

    x, w = ((2, 64, 40), torch.float16, "cpu"), ((64, 64), torch.float16, "cpu")
    as_param, _, _ = C.trace_sites(fn, [x, (*w, True)])
    assert [(s.family, s.n, s.k) for s in as_param.sites] == [("gemm", 64, 64)]
    plain, _, _ = C.trace_sites(fn, [x, w])
    assert not plain.sites and any("bmm" in n for n, _ in plain.skipped)
