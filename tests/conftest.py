import os
import shutil
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture(scope="session")
def _hot_path_build(tmp_path_factory) -> Path:
    """A JIT directory holding the C++ hot path, really built once per test session (the host compiler against the
    installed torch: ~55 s on the 2-core CI machine) in a fresh process. `hot_path_jit` hands each test a copy."""
    jit = tmp_path_factory.mktemp("hot_path_build") / "jit"
    code = "from oasr_ops.codegen.host_ext import HostExtension; print(HostExtension().build())"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OASR_JIT_DIR": str(jit)},
                       capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return jit


@pytest.fixture
def hot_path_jit(_hot_path_build, tmp_path) -> Path:
    """A JIT directory of the test's own (its kernels and plans land there) that already holds the session's verified
    hot-path library, so the test loads it instead of compiling it again. The build from an empty directory inside
    `hot_path.enable` stays covered by tests/test_hot_path.py::test_backend_switches_the_hot_path_on_inside_a_real_compile."""
    jit = tmp_path / "jit"
    shutil.copytree(_hot_path_build, jit)  # the directory's 0700 mode comes along (cache_trust refuses others')
    return jit
