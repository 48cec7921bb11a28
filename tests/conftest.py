import os

# A developer's own tuning never changes what a test sees; tests that need a user tier set their own directory.
os.environ["OASR_TUNE_USER_DB"] = "off"


import pytest  # noqa: E402

# fixtures shared by the graph-pass tests (fresh_inductor)
pytest_plugins = ("_fx_capture",)


@pytest.fixture
def tuning_env(tmp_path, monkeypatch):
    """A tuning DB of the test's own: user and system tiers under tmp_path, arch sm90, selection env unset."""
    from types import SimpleNamespace

    from oasr_ops import paths
    from oasr_ops.tune import database

    user, system = tmp_path / "user", tmp_path / "system"
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(user))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    for v in ("OASR_GEMM_HEURISTIC", "OASR_TUNE_MODEL_FALLBACK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(paths, "system_db_dir", lambda: system)
    database.reload()
    yield SimpleNamespace(user=user, system=system)
    monkeypatch.undo()
    database.reload()
