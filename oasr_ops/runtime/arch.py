"""Which GPU family this process serves: `sm90` for an H100/H200, `sm80` for an A100, ...

`OASR_ARCH` overrides detection (a CPU machine building or tuning for a GPU it does not have).
"""
from __future__ import annotations

import functools
import os
import re

_ARCH_RE = re.compile(r"^sm(\d{2,3})a?$")


def normalize_arch(arch: str) -> str:
    """Spellings `sm90`, `sm_90`, `sm90a`, `9.0`, `9.0a`, `90` -> `sm90`. ValueError otherwise."""
    s = str(arch).strip().lower().replace("_", "")
    m = re.match(r"^(\d+)\.(\d)a?$", s)
    if m:
        return f"sm{m.group(1)}{m.group(2)}"
    if s.isdigit():
        return f"sm{s}"
    m = _ARCH_RE.match(s)
    if m:
        return f"sm{m.group(1)}"
    raise ValueError(f"not an arch family: {arch!r} (expected e.g. 'sm90' or '9.0a')")


@functools.lru_cache(maxsize=None)
def _detected() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def current_arch_family() -> str | None:
    """The arch family of the current GPU, `OASR_ARCH` if set, else None on a machine without a GPU."""
    env = os.environ.get("OASR_ARCH", "").strip()
    if env:
        return normalize_arch(env)
    return _detected()


def require_arch(arch: str | None) -> str:
    a = normalize_arch(arch) if arch else current_arch_family()
    if a is None:
        raise RuntimeError("no GPU here: pass arch explicitly (e.g. arch='sm90') or set OASR_ARCH")
    return a


def gpu_sku() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()
