"""The switches of the ``OASR_*`` environment variables that take a fixed set of values (the paths ones,
``OASR_JIT_DIR`` / ``OASR_TUNE_USER_DB``, live in `paths.py`; ``OASR_ARCH`` is checked by `runtime.arch`).

Why one place: a misspelt value used to mean the default silently — ``OASR_JIT_BUILD=of`` kept on-first-use
nvcc builds on, the very thing a serving machine sets it to avoid. Now every such value is read here: a value
outside the variable's set warns once (naming the variable, the value and the accepted ones) and the default
applies. The values are read at each call (tests and users set them at run time); the warning is remembered per
(variable, value).
"""
from __future__ import annotations

import functools
import os
import warnings

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")

#: The variables that change what a selection answers (the untuned tiers' rules): part of the graph pass's
#: Inductor cache key (`runtime.select.selection_hash`), or a compiled graph cached under one setting would be
#: reused, with the tiles it baked, under another (session 36: an A/B of OASR_FP8_HEURISTIC_FAST_ACCUM in two
#: processes ran the first process's graph twice).
SELECTION_VARS = ("OASR_GEMM_HEURISTIC", "OASR_TUNE_MODEL_FALLBACK", "OASR_FP8_HEURISTIC_FAST_ACCUM",
                  "OASR_GEMM_COMPILE_SET")  # the last: a DB config outside the production set is skipped


@functools.lru_cache(maxsize=None)
def _warn_once(name: str, value: str, accepted: str, default: str) -> None:
    warnings.warn(f"oasr_ops: {name}={value!r} is not one of {accepted}; using the default ({default})",
                  RuntimeWarning, stacklevel=3)


def switch(name: str, default: bool, extra_on: tuple[str, ...] = ()) -> bool:
    """An on/off variable: unset or empty -> `default`; 1/on/true/yes (and `extra_on`) -> True; 0/off/false/no
    -> False (case-insensitive); anything else warns once and gives `default`."""
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return default
    if v in _ON or v in extra_on:
        return True
    if v in _OFF:
        return False
    _warn_once(name, v, "/".join((*_ON, *extra_on, *_OFF)), "on" if default else "off")
    return default


def choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """A variable taking one of `choices` (case-insensitive); unset or empty -> `default`; anything else warns
    once and gives `default`."""
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return default
    if v in choices:
        return v
    _warn_once(name, v, "/".join(choices), default)
    return default


def jit_build() -> bool:
    """``OASR_JIT_BUILD`` (default on): off -> a kernel missing from the cache is never compiled on first use."""
    return switch("OASR_JIT_BUILD", True)


def compile_set() -> str:
    """``OASR_GEMM_COMPILE_SET``: ``tuned`` (default) or ``all``."""
    return choice("OASR_GEMM_COMPILE_SET", ("tuned", "all"), "tuned")


def model_fallback() -> bool:
    """``OASR_TUNE_MODEL_FALLBACK`` (default ``auto``, on): 0 turns the cost-model tier off."""
    return switch("OASR_TUNE_MODEL_FALLBACK", True, extra_on=("auto",))


def gemm_heuristic() -> bool:
    """``OASR_GEMM_HEURISTIC`` (default on): 0 -> every shape of a lane-default family gets the lane default."""
    return switch("OASR_GEMM_HEURISTIC", True)


def fp8_heuristic_fast_accum() -> bool:
    """``OASR_FP8_HEURISTIC_FAST_ACCUM`` (default on): off -> the fp8 family's untuned heuristic answers
    full-fp32-accumulation tiles at every K (on: FastAccum tiles up to its FAST_ACCUM_MAX_K)."""
    return switch("OASR_FP8_HEURISTIC_FAST_ACCUM", True)


def cpp_hot_path() -> bool:
    """``OASR_CPP_HOT_PATH`` (default off): on (or ``cuda``) -> the C++ hot path at import when CUDA is there."""
    return switch("OASR_CPP_HOT_PATH", False, extra_on=("cuda",))
