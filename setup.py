"""The package list and layout only; metadata, dependencies and entry points are in pyproject.toml.

templates/ and db/ live at the repository root and are installed inside the package as oasr_ops/templates and
oasr_ops/db (oasr_ops.paths finds either location). setuptools' `packages.find` cannot combine discovery with
that package-dir mapping, so the list is computed here: every `oasr_ops*` package on disk (a new subpackage is
picked up without an edit), oasr_ops.templates, oasr_ops.db and one oasr_ops.db.<arch> per arch folder of db/.
"""
from pathlib import Path

from setuptools import find_packages, setup

_ROOT = Path(__file__).resolve().parent
_ARCHS = sorted(p.name for p in (_ROOT / "db").iterdir() if p.is_dir() and not p.name.startswith("."))

setup(
    packages=[*find_packages(include=["oasr_ops", "oasr_ops.*"]), "oasr_ops.templates", "oasr_ops.db",
              *(f"oasr_ops.db.{a}" for a in _ARCHS)],
    package_dir={"oasr_ops.templates": "templates", "oasr_ops.db": "db"},
    package_data={"oasr_ops.templates": ["*.j2", "*.cpp"], "oasr_ops.db": ["README.md"],
                  **{f"oasr_ops.db.{a}": ["*.json"] for a in _ARCHS}},
)
