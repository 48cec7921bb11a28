"""The census file's reader: a census document read and checked (the format is `census.py`'s docstring).

Every reader of a census goes through here — `oasr tune build`, `prebuild --census`, `matrix`, `prewarm(census=...)`
— so a file others wrote and edited is checked once, the same way, before any of them uses a point.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def check_census_doc(doc: Any, where: str) -> None:
    """UsageError (a ValueError) naming `where`, the signature and the point unless `doc` has the shape `census.py`'s
    docstring gives: a census is a file others write and edit, and a malformed one must not surface as a
    KeyError from deep in a build. What the readers use is checked: every signature's body is an object whose
    ``points`` (if any) are objects with an integer ``m`` (or ``M``) > 0 and, where present, ``weight`` and
    ``eager_fraction`` finite numbers >= 0 (the fraction <= 1), ``calls`` an integer >= 0, ``must_tune`` a bool,
    ``weight_bytes``, ``n`` and ``k`` integers >= 0."""
    import math

    from ..errors import UsageError, is_int, is_number

    def bad(msg: str) -> UsageError:
        return UsageError(f"{where}: {msg}")

    def is_finite(v: Any) -> bool:
        return is_number(v) and math.isfinite(v)

    sigs = doc.get("signatures") if isinstance(doc, dict) else None
    if not isinstance(sigs, dict) or doc.get("kind") not in (None, "oasr-census"):
        raise bad("not a census file (write one with `oasr tune census`)")
    if not (doc.get("weight_bytes") in (None, 0) or is_int(doc["weight_bytes"]) and doc["weight_bytes"] >= 0):
        raise bad(f"weight_bytes must be an integer >= 0, got {doc['weight_bytes']!r}")
    for sig, body in sigs.items():
        if not isinstance(body, dict):
            raise bad(f"signature {sig!r}: not an object")
        for key in ("weight_bytes", "n", "k"):
            if key in body and not (is_int(body[key]) and body[key] >= 0):
                raise bad(f"signature {sig!r}: {key} must be an integer >= 0, got {body[key]!r}")
        points = body.get("points", [])
        if not isinstance(points, list):
            raise bad(f"signature {sig!r}: points must be a list, got {type(points).__name__}")
        for i, p in enumerate(points):
            m = p.get("m", p.get("M")) if isinstance(p, dict) else None
            if not (is_int(m) and m > 0):
                raise bad(f"signature {sig!r} point {i}: needs an integer m > 0, got {p!r}")
            if "weight" in p and not (is_finite(p["weight"]) and p["weight"] >= 0):
                raise bad(f"signature {sig!r} point {i}: weight must be a finite number >= 0, got {p['weight']!r}")
            if "eager_fraction" in p and not (is_finite(p["eager_fraction"]) and 0 <= p["eager_fraction"] <= 1):
                raise bad(f"signature {sig!r} point {i}: eager_fraction must be in [0, 1], "
                          f"got {p['eager_fraction']!r}")
            if "calls" in p and not (is_int(p["calls"]) and p["calls"] >= 0):
                raise bad(f"signature {sig!r} point {i}: calls must be an integer >= 0, got {p['calls']!r}")
            if "must_tune" in p and not isinstance(p["must_tune"], bool):
                raise bad(f"signature {sig!r} point {i}: must_tune must be true or false, got {p['must_tune']!r}")


def check_census(path: str | Path, what: str = "--census") -> dict[str, Any]:
    """The census document at `path`, checked (`check_census_doc`); UsageError naming `what` and the file."""
    from ..errors import json_file

    doc = json_file(path, what)
    check_census_doc(doc, f"{what} {path}")
    return doc


def load_census(path_or_doc: str | Path | dict) -> dict[str, Any]:
    """A census document (a path is read), checked: ValueError naming the problem for a malformed one."""
    if isinstance(path_or_doc, dict):
        check_census_doc(path_or_doc, "census")
        return path_or_doc
    return check_census(path_or_doc, "census")


def point_m(p: dict[str, Any]) -> int:
    """A checked point's M: ``m``, or ``M`` as some hand-written censuses spell it (`check_census_doc` accepts both,
    so every reader must read both)."""
    return int(p["m"] if "m" in p else p["M"])


def must_tune_points(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(signature, signature meta, point) for every must-tune point of a census document."""
    out = []
    for sig, s in doc.get("signatures", {}).items():
        for p in s.get("points", []):
            if p.get("must_tune"):
                out.append((sig, s, p))
    return out
