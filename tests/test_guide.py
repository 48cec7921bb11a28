"""docs/guide.md's ```python blocks run as written, each in a fresh CPU-only process.

A block that fails, or a guide that lost its snippets, fails here. The blocks run against this checkout
(PYTHONPATH, as pytest.ini does for the suite) with their own caches and no user tuning tier, so a developer's
~/.cache never changes what they print. `backend="oasr"` by name needs the installed entry point
(`pip install -e .`, which scripts/test.sh does); blocks using it are skipped otherwise.
"""
from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks() -> list[tuple[int, str]]:
    """(line number of the opening fence, code) for every ```python block."""
    text = GUIDE.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


BLOCKS = python_blocks()


def test_guide_has_runnable_snippets_for_each_topic() -> None:
    code = "\n".join(c for _, c in BLOCKS)
    assert len(BLOCKS) >= 6
    for needle in ("oasr_ops.gemm(", 'backend="oasr"', "tuning_report()", "prewarm(", "database.publish(",
                   '"tune", "diff"', "quantize_("):
        assert needle in code, f"docs/guide.md has no runnable snippet using {needle}"


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{ln}" for ln, _ in BLOCKS])
def test_block_parses(line: int, code: str) -> None:
    ast.parse(code, filename=f"docs/guide.md:{line}")


def _oasr_backend_installed() -> bool:
    return any(e.name == "oasr" for e in importlib.metadata.entry_points(group="torch_dynamo_backends"))


@pytest.mark.slow
@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{ln}" for ln, _ in BLOCKS])
def test_block_runs_on_cpu(line: int, code: str, tmp_path: Path) -> None:
    if 'backend="oasr"' in code and not _oasr_backend_installed():
        pytest.skip("backend='oasr' by name needs the package installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OASR_", "TORCHINDUCTOR_"))}
    env.update({
        "CUDA_VISIBLE_DEVICES": "",                        # the CPU paths, also on a GPU machine
        "OASR_TUNE_USER_DB": "off",                        # a block that needs a user tier sets its own
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    })
    script = tmp_path / "snippet.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"docs/guide.md:{line} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), f"docs/guide.md:{line} printed nothing"
