"""The one point type of the offline tools: a (signature, M) the build, prewarm, evaluate and the partition's
census thinning talk about.

A point is M on a signature's M axis plus what the census knows about its traffic. Each tool fills the fields
it has: the build works from census files (weight, calls, must_tune, eager_fraction; fill points are its own
ladder rungs), prewarm from a census or a traced model (the signature's parts and the call's dtype), evaluate
from a measurement log (weight). ``m`` comes first so that ``Point(m, weight, calls, must_tune, eager)`` reads
like the census record it is built from.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Point:
    """One M of one signature.

    m:              rows of the GEMM (L * M for bmm).
    weight:         the point's share of the objective (census traffic; fill points get a small one).
    calls:          calls per workload (census).
    must_tune:      strict mode refuses to run it untuned.
    eager_fraction: share of its calls issued eagerly (the alpha of the build objective).
    fill:           a ladder fill point of the build (not a census point).
    validation:     a held-out point of the build (a geometric midpoint between consecutive measured Ms): measured,
                    but only used to check that the regions hold there (partition.partition_validated).
    signature:      the DB signature (``dt=half`` spelling for the half-precision families).
    family, op:     the signature's DB family and op.
    dtype:          the call's dtype name (``fp16`` / ``bf16``; ``half`` where the signature is all one knows).
    n, k:           the signature's N and K.
    """

    m: int
    weight: float = 0.0
    calls: int = 0
    must_tune: bool = False
    eager_fraction: float = 0.0
    fill: bool = False
    signature: str = ""
    family: str = ""
    op: str = ""
    dtype: str = "half"
    n: int = 0
    k: int = 0
    validation: bool = False


def point_of(signature: str, m: int, dtype: str | None = None, **fields) -> Point:
    """A point of `signature` with its family, op, N and K filled in from the signature; ValueError if the
    signature is not a well-formed one of a registered family."""
    from ..runtime.database import parse_signature

    parts = parse_signature(signature)
    if parts is None:
        raise ValueError(f"malformed signature: {signature!r}")
    return Point(int(m), signature=signature, family=parts.family, op=parts.op,
                 dtype=dtype or parts.dt or "half", n=parts.n, k=parts.k, **fields)
