"""Packaging: every third-party import of the package is declared, and a built wheel carries the whole package.

The wheel test builds from a copy of the sources (pip, build isolation from the configured index) so the
checkout gets no build/ or egg-info, and checks what `pip install .` would put on a user's machine: every module
(new subpackages included without an edit), templates/ and db/ inside the package, no lock files, the `oasr`
command and the `torch_dynamo_backends` entry point.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
# import name -> distribution name, for the imports whose names differ or that an extra provides
_DIST = {"cutlass_library": "nvidia-cutlass", "yaml": "pyyaml"}


def _requirement_name(req: str) -> str:
    for sep in "<>=!~[; ":
        req = req.split(sep)[0]
    return req.strip().lower().replace("_", "-")


def _third_party_imports(pkg: Path) -> dict[str, str]:
    """top-level module -> first file importing it, over every .py of the package (lazy imports included)."""
    seen: dict[str, str] = {}
    for f in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top != "oasr_ops" and top not in sys.stdlib_module_names:
                    seen.setdefault(top, str(f.relative_to(ROOT)))
    return seen


def test_every_third_party_import_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    for reqs in project["optional-dependencies"].values():
        declared |= {_requirement_name(r) for r in reqs}
    imports = _third_party_imports(ROOT / "oasr_ops")
    assert {"torch", "numpy", "jinja2", "filelock"} <= set(imports)  # the scan sees the package's imports
    missing = {m: f for m, f in imports.items() if _DIST.get(m, m).lower().replace("_", "-") not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert "matplotlib" in {_requirement_name(r) for r in project["optional-dependencies"]["plot"]}
    assert "pytest" in {_requirement_name(r) for r in project["optional-dependencies"]["test"]}


@pytest.mark.slow
def test_wheel_carries_the_package_templates_db_and_entry_points(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.lock")
    for name in ("oasr_ops", "templates", "db"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    # a subpackage nobody listed anywhere: discovery must pick it up
    (src / "oasr_ops" / "zz_probe_pkg").mkdir()
    (src / "oasr_ops" / "zz_probe_pkg" / "__init__.py").write_text("")
    (src / "db" / "sm90" / "gemm.json.lock").write_text("")  # a stray lock file must not ship

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "out"),
                        str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = (tmp_path / "out").glob("oasr_ops-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())

    want = {str(p.relative_to(src)) for p in (src / "oasr_ops").rglob("*.py")}
    want |= {f"oasr_ops/templates/{p.name}" for p in (ROOT / "templates").glob("*.j2")}
    want |= {f"oasr_ops/templates/{p.name}" for p in (ROOT / "templates").glob("*.cpp")}  # the C++ hot path
    assert "oasr_ops/templates/hot_path.cpp" in want
    want |= {f"oasr_ops/db/{p.relative_to(ROOT / 'db')}" for p in (ROOT / "db").glob("*/*.json")}
    assert "oasr_ops/zz_probe_pkg/__init__.py" in want and any(n.startswith("oasr_ops/db/") for n in want)
    assert not want - names, f"missing from the wheel: {sorted(want - names)}"
    assert not [n for n in names if n.endswith(".lock")]

    info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(whl).read(info).decode()
    assert "oasr = oasr_ops.cli:main" in entry_points
    assert "[torch_dynamo_backends]" in entry_points and "oasr = oasr_ops.inductor.backend:oasr_backend" in entry_points
