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
