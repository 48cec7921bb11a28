"""The standalone kernel A/B tools render what they claim: benchmarks/conv2d_direct_ab/render.py and
benchmarks/dwconv_ab/gen.py put the template as of a git revision next to the template in the tree (the GPU host
only runs the binaries built from these sources). Rendering only: compiling them is nvcc's job on the GPU-bound
machine, checked by the logs they produced."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_conv2d_direct_ab_renders_baseline_tree_and_the_register_variant(tmp_path):
    _run("benchmarks/conv2d_direct_ab/render.py", "--old", "HEAD:dc128x128_v8_n256", "--out", str(tmp_path))
    old = (tmp_path / "old_HEAD_dc128x128_v8_n256.cu").read_text()
    new = (tmp_path / "new_dc256x128_v8_n128.cu").read_text()
    reg = (tmp_path / "x_reg_dc256x128_v8_n128.cu").read_text()
    assert "oasr_conv2d_run" in old and "oasr_conv2d_run" in new
    assert "constexpr bool kMmaPath = kVec == 8" in new  # the tree's tensor-core path, on
    assert "constexpr bool kMmaPath = false && kVec == 8" in reg  # the variant turns exactly that off
    assert len(list(tmp_path.glob("new_*.cu"))) == 7


def test_dwconv_ab_renders_both_templates_in_one_include(tmp_path):
    _run("benchmarks/dwconv_ab/gen.py", "--base", "HEAD", "--out", str(tmp_path))
    inc = (tmp_path / "variants.inc").read_text()
    opened = [ln.split()[1] for ln in inc.splitlines() if ln.startswith("namespace ")]
    assert sum(n.startswith("base_") for n in opened) == 3 and sum(n.startswith("repo_") for n in opened) == 11
    assert "static const Variant kVariants[]" in inc and "#include" not in inc
