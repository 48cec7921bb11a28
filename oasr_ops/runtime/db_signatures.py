"""Tuning-DB signatures: the spec's strings naming one (family, op, dtype, N, K), e.g.
``gemm|op=gemm|dt=half|N=512|K=256``; one spelling per signature (no leading zeros, no whitespace)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import registry as _registry

# Families whose signature carries the activation dtype (the quantized families' operand dtype is the family).
SIG_DTYPES = ("half", "fp16", "bf16")

_SIG_RE = re.compile(r"([a-z0-9_]{1,32})\|op=([a-z0-9_]{1,32})(?:\|dt=([a-z0-9]{1,8}))?\|N=([1-9]\d{0,8})"
                     r"\|K=([1-9]\d{0,8})")


def _known(family: str, op: str) -> bool:
    """`family` is registered (oasr_ops/families) and `op` is one of its ops."""
    fams = _registry.families()
    return family in fams and op in fams[family].ops


def normalize_dtype(dtype: Any) -> str:
    """torch dtypes and spellings -> 'fp16' | 'bf16' | 'half' | 'int8' | 'fp8' | 'fp32'. ValueError otherwise."""
    s = str(dtype).lower().removeprefix("torch.")
    table = {"float16": "fp16", "fp16": "fp16", "half": "half", "bfloat16": "bf16", "bf16": "bf16",
             "int8": "int8", "float8_e4m3fn": "fp8", "fp8": "fp8", "float32": "fp32", "fp32": "fp32"}
    try:
        return table[s]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None


def signature(family: str, op: str, dtype: Any, n: int, k: int) -> str:
    """The spec's signature string. `dtype` is ignored for the quantized families. ValueError on bad parts."""
    if not _known(family, op):
        raise ValueError(f"unknown family/op {family!r}/{op!r}")
    if not (isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0):
        raise ValueError(f"N and K must be positive ints, got {n!r}, {k!r}")
    if _registry.get(family).dtyped:
        dt = normalize_dtype(dtype)
        if dt not in SIG_DTYPES:
            raise ValueError(f"{family} signatures take dt half/fp16/bf16, not {dt}")
        return f"{family}|op={op}|dt={dt}|N={n}|K={k}"
    return f"{family}|op={op}|N={n}|K={k}"


@dataclass(frozen=True)
class SigParts:
    family: str
    op: str
    dt: str | None
    n: int
    k: int


def parse_signature(sig: Any) -> SigParts | None:
    """The parts of a well-formed signature, or None (also for leading zeros or a trailing newline)."""
    if not isinstance(sig, str):
        return None
    m = _SIG_RE.fullmatch(sig)
    if not m:
        return None
    fam, op, dt, n, k = m.groups()
    if not _known(fam, op):
        return None
    if _registry.get(fam).dtyped != (dt is not None) or (dt is not None and dt not in SIG_DTYPES):
        return None
    return SigParts(fam, op, dt, int(n), int(k))


def lookup_signatures(family: str, op: str, dtype: Any, n: int, k: int) -> list[str]:
    """Signatures to try within one tier, most specific first (dt=fp16/bf16 before dt=half)."""
    if not _registry.get(family).dtyped:
        return [signature(family, op, None, n, k)]
    dt = normalize_dtype(dtype)
    if dt in ("fp16", "bf16"):
        return [signature(family, op, dt, n, k), signature(family, op, "half", n, k)]
    if dt == "half":
        return [signature(family, op, "half", n, k)]
    return []  # fp32/int8 calls of a half-precision family: nothing in the DB serves them
