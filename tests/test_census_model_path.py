"""`oasr tune census --model`: a file path works from any directory, and the checkout is never put first."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oasr_ops.tune.census_model import load_builder

ROOT = Path(__file__).resolve().parents[1]


def test_file_path_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(ROOT)])  # as a fresh interpreter elsewhere
    before = list(sys.path)
    fn, mod = load_builder(f"{ROOT / 'examples' / 'conformer.py'}:build_model")
    assert mod.__name__ == "examples.conformer" and Path(mod.__file__).resolve() == ROOT / "examples" / "conformer.py"
    assert fn("S", dtype="fp16", device="meta", num_layers=1).num_layers == 1
    assert sys.path[:len(before)] == before   # appended, never first


@pytest.mark.parametrize("spec,needle", [("examples/nope.py:f", "no Python file"),
                                         ("examples/conformer.py:nope", "no function 'nope'"),
                                         ("no_such_module_xyz:f", "cannot import"),
                                         ("conformer", "module:function")])
def test_bad_model_spec_is_a_clear_error(spec, needle, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match=needle):
        load_builder(spec)
