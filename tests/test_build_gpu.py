"""A small `oasr tune build` end to end on the GPU: two signatures, measured, partitioned, published, served."""
import json

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_small_build_end_to_end(tmp_path, monkeypatch):
    from oasr_ops.tune import database
    from oasr_ops.tune.build import BuildOptions, build
    from oasr_ops.tune.evaluate import evaluate, read_log
    from oasr_ops.tune.select import select_config

    sigs = {
        "gemm|op=gemm|dt=half|N=512|K=512": {"points": [{"m": m, "weight": 1.0, "calls": 4, "must_tune": True,
                                                          "eager_fraction": 0.0} for m in (16, 250, 4000)]},
        "gemm|op=gemm_activation|dt=half|N=2048|K=512": {"points": [
            {"m": m, "weight": 1.0, "calls": 4, "must_tune": True, "eager_fraction": 0.0} for m in (64, 2000)]},
    }
    census = tmp_path / "census.json"
    census.write_text(json.dumps({"weight_bytes": 2**30, "signatures": sigs}))
    out = tmp_path / "user"
    opts = BuildOptions(out=str(out), rounds=3, max_fill=1, log=tmp_path / "log.jsonl",
                        checkpoint_dir=tmp_path / "ckpt", progress=False)
    res = build([str(census)], opts)
    assert set(res.entries) == set(sigs)
    assert res.points_measured >= 5 and not res.rejected, res.rejected
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(out))
    database.reload()
    log = read_log(tmp_path / "log.jsonl")
    for sig, body in sigs.items():
        regions = res.entries[sig]["regions"]
        assert regions[-1][0] is None
        op, n, k = sig.split("|")[1][3:], int(sig.split("N=")[1].split("|")[0]), int(sig.split("K=")[1])
        for p in body["points"]:
            sel = select_config("gemm", op, torch.float16, n, k, p["m"])
            assert sel.tier == "user"
            want = next(c for hi, c in regions if hi is None or p["m"] <= hi)
            assert sel.config == want
    result = evaluate(log, {"db": json.loads((out / "sm90" / "gemm.json").read_text())["entries"]})
    assert result["points"] >= 5
    database.reload()


@pytest.mark.parametrize("order,separator", [("alternate", True), ("alternate", False), ("shuffle", False)])
def test_bench_measure_orders_and_separator(order, separator):
    """tune.bench.measure with the census benchmark's options (benchmarks/scaled_mm_fp8.py): every arm gets one
    sample per round, positive per-call times; without the separator a heavier arm still times heavier (nothing
    is subtracted that belongs to the arm)."""
    from oasr_ops.tune import bench

    x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    small = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    arms = {"big": [lambda: x @ x] * 8, "small": [lambda: small @ small] * 8}
    res = bench.measure(arms, rounds=4, order=order, separator=separator)
    assert set(res) == {"big", "small"}
    for r in res.values():
        assert len(r.samples_s) == 4 and all(t >= 0 for t in r.samples_s) and r.estimate.median_s > 0
    assert res["big"].estimate.median_s > res["small"].estimate.median_s
