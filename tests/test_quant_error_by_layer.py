"""benchmarks/quant_error_by_layer.py: the groups it forms and the errors it reports (CPU, a small Conformer)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from quant_error_by_layer import role  # noqa: E402


def test_role_drops_the_block_index_only():
    assert role("blocks.3.ff1.fc1") == "ff1.fc1"
    assert role("blocks.11.mlp.0") == "mlp.0"
    assert role("subsample.out") == "subsample.out"
    assert role("encoder.layers.2.attn.out") == "encoder.layers.attn.out"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/quant_error_by_layer.py", "--model",
                           "examples.conformer:build_model", "--model-args", "size=S", "--inputs",
                           "examples.conformer:example_inputs", "--input-args", "batch=1,frames=64", *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_groups_and_errors(tmp_path):
    out = tmp_path / "err.json"
    r = _run("--extra", r"ff=\.ff[12]\.", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = {(x["scheme"], x["group"]): x for x in json.loads(out.read_text())["rows"]}
    for scheme in ("fp8_w8a8", "int8_w8a8"):
        assert rows[scheme, "all"]["layers"] == 129 and rows[scheme, "ff"]["layers"] == 64
        assert rows[scheme, "ff1.fc1"]["layers"] == 16 and rows[scheme, "subsample.out"]["layers"] == 1
        assert all(0 < x["max_rel"] < 1 for (s, _g), x in rows.items() if s == scheme)
        # a subset of the layers quantized gives less error than all of them
        assert rows[scheme, "ff1.fc1"]["rms_rel"] < rows[scheme, "all"]["rms_rel"]
    # e4m3 keeps 3 mantissa bits, per-token int8 7: the format's difference, with no kernel involved
    assert rows["fp8_w8a8", "all"]["rms_rel"] > 2 * rows["int8_w8a8", "all"]["rms_rel"]


def test_bad_extra_group_is_a_clear_error():
    r = _run("--extra", "nothing=^no_such_layer$")
    assert r.returncode == 2 and "matches none" in r.stderr
    r = _run("--extra", "noequals")
    assert r.returncode == 2 and "expected NAME=REGEX" in r.stderr
