"""The OASR_* switches (oasr_ops/env.py): accepted values, defaults, and one warning for a value outside the set
(a misspelt ``OASR_JIT_BUILD=of`` used to keep on-first-use nvcc builds on without a word)."""
from __future__ import annotations

import warnings

import pytest

from oasr_ops import env
from oasr_ops.codegen.jit import on_demand_builds_allowed
from oasr_ops.runtime.production import compile_all


@pytest.fixture(autouse=True)
def _fresh_warnings():
    env._warn_once.cache_clear()
    yield
    env._warn_once.cache_clear()


@pytest.mark.parametrize("value,expected", [(None, True), ("", True), ("off", False), ("OFF", False), ("0", False),
                                            ("no", False), ("false", False), ("on", True), ("1", True),
                                            ("Yes", True)])
def test_jit_build_accepted_values(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("OASR_JIT_BUILD", raising=False)
    else:
        monkeypatch.setenv("OASR_JIT_BUILD", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an accepted value never warns
        assert on_demand_builds_allowed() is expected


def test_a_misspelt_value_warns_once_and_the_default_applies(monkeypatch):
    monkeypatch.setenv("OASR_JIT_BUILD", "of")
    with pytest.warns(RuntimeWarning, match=r"OASR_JIT_BUILD='of' is not one of .*off.*using the default \(on\)"):
        assert on_demand_builds_allowed() is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert on_demand_builds_allowed() is True  # the same value again: no second warning
    monkeypatch.setenv("OASR_GEMM_COMPILE_SET", "everything")
    with pytest.warns(RuntimeWarning, match=r"OASR_GEMM_COMPILE_SET='everything' is not one of tuned/all"):
        assert compile_all() is False
    monkeypatch.setenv("OASR_GEMM_COMPILE_SET", "ALL")
    assert compile_all() is True


@pytest.mark.parametrize("name,fn,default,extra", [
    ("OASR_TUNE_MODEL_FALLBACK", env.model_fallback, True, "auto"),
    ("OASR_GEMM_HEURISTIC", env.gemm_heuristic, True, None),
    ("OASR_CPP_HOT_PATH", env.cpp_hot_path, False, "cuda"),
])
def test_each_switch(monkeypatch, name, fn, default, extra):
    monkeypatch.delenv(name, raising=False)
    assert fn() is default
    monkeypatch.setenv(name, "0")
    assert fn() is False
    monkeypatch.setenv(name, "1")
    assert fn() is True
    if extra:
        monkeypatch.setenv(name, extra)
        assert fn() is True
    monkeypatch.setenv(name, "maybe")
    with pytest.warns(RuntimeWarning, match=name):
        assert fn() is default
