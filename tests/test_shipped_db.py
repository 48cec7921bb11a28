"""The shipped system tier (db/sm90/*.json) loads cleanly: hard validators pass, every entry and region is
valid against this package's lanes, and it serves the signatures it was built for."""
import json
import warnings

import pytest

from oasr_ops import paths
from oasr_ops.runtime import select
from oasr_ops.tune import database


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setenv("OASR_ARCH", "sm90")
    database.reload()
    yield
    monkeypatch.undo()
    database.reload()


_FP8_SHIPPED = (paths.system_db_dir() / "sm90" / "scaled_mm_fp8.json").exists()


@pytest.mark.parametrize("family", ["gemm", "scaled_mm", pytest.param(
    "scaled_mm_fp8", marks=pytest.mark.skipif(not _FP8_SHIPPED, reason="db/sm90/scaled_mm_fp8.json not built yet "
                                                                       "(scripts/device_run.sh build-fp8)"))])
def test_shipped_file_loads_without_problems(sm90, family):
    path = paths.system_db_dir() / "sm90" / f"{family}.json"
    doc = json.loads(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any skipped file, entry or region warns: fail on it
        lf = database.get_file("system", "sm90", family)
    assert lf is not None and len(lf.entries) == len(doc["entries"]) > 0
    rep = next(r for r in database.report("sm90")["files"] if r["path"] == str(path))
    assert rep["status"] == "loaded" and not rep["problems"]
    for sig, e in lf.entries.items():
        assert e.regions[-1][0] is None, f"{sig}: a build entry ends with a catch-all"
        assert all(cfg is not None for _, cfg in e.regions), f"{sig}: a region was dropped"


def test_shipped_gemm_db_serves_the_conformer_ffn(sm90):
    s = select.select_config("gemm", "gemm_activation", "fp16", 2048, 512, 4000)
    entry = database.get_file("system", "sm90", "gemm").entries["gemm|op=gemm_activation|dt=half|N=2048|K=512"]
    assert s.tier == "system" and s.config == entry.lookup(4000)
