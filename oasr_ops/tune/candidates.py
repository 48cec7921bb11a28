"""The candidate interface as the offline tools consume it (build, pruning, prebuild --census, prewarm, autotune).

A family supplies, through its registry spec (`oasr_ops.runtime.registry.FamilySpec.handlers`):

    "candidates": fn(sig_parts, arch) -> list[Candidate]   every arm of one signature, statically feasible
    "operands":   fn(point, device, seed, copies=1, like=None) -> Operands   fresh random inputs + reference

`Candidate`, `Gate` and `Operands` are defined in `oasr_ops.families.candidate` (so a family builds them without
importing this layer) and re-exported here. This module adds what every tool does with them — look a family's
factory up, gate candidates numerically, price host issue cost — and never names a family.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Sequence

from ..families.candidate import Candidate, Gate, Operands  # noqa: F401  (the interface, re-exported)
from ..runtime import registry
from ..runtime.database import SigParts, parse_signature
from .points import Point

__all__ = ["Candidate", "Gate", "Operands", "tunable_families", "parts_of", "candidates_for", "operands_for",
           "fallback_id", "pseudo_arms", "gate_candidates", "host_costs"]


def tunable_families() -> list[str]:
    """Families that can be measured (their spec has a candidate factory), in registration order."""
    return [name for name, spec in registry.families().items()
            if spec.handler("candidates") is not None and spec.handler("operands") is not None]


def parts_of(signature: str) -> SigParts:
    """The parts of a well-formed signature of a registered family; ValueError naming it otherwise."""
    parts = parse_signature(signature)
    if parts is None:
        raise ValueError(f"malformed signature: {signature!r}")
    return parts


def candidates_for(parts: SigParts, arch: str) -> list[Candidate]:
    """The family's arms for one signature on `arch` ([] for a family without a factory)."""
    factory = registry.get(parts.family).handler("candidates")
    return list(factory(parts, arch)) if factory is not None else []


def operands_for(point: Point, device: Any, seed: int = 0, *, copies: int = 1,
                 like: Operands | None = None) -> Operands:
    """Fresh random inputs for `point` from its family (``like``: reuse its weight copies and constants)."""
    make = registry.get(point.family).handler("operands")
    if make is None:
        raise ValueError(f"kernel family {point.family!r} supplies no operands (it cannot be measured)")
    return make(point, device, seed, copies=copies, like=like)


def fallback_id(cands: Iterable[Candidate], default: str = "torch") -> str:
    """The partition's fallback arm: the candidate marked ``fallback`` (`default` if none is)."""
    return next((c.id for c in cands if c.fallback), default)


def pseudo_arms(cands: Iterable[Candidate]) -> list[Candidate]:
    """Candidates whose config is resolved per point (a ``heuristic`` pseudo-arm times the heuristic's tile)."""
    return [c for c in cands if c.resolve is not None]


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality of two outputs (one-byte floats compared as bytes: fp8 has no equality kernel)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return bool(torch.equal(a, b))


def gate_candidates(cands: Sequence[Candidate], operands: Operands, *, catch: bool = False,
                    deadline: float | None = None, variants: bool = True) -> tuple[list[Candidate], dict[str, str]]:
    """Run every candidate once on `operands` and judge its output by its gate. Returns (passed, {id: reason}).
    A candidate passes only if it also passes on each of ``operands.variants`` (the same inputs as the op is also
    served them, e.g. the fp8 family's fp16 output: the DB serves both output dtypes, the build times bf16); the
    reason of a rejection there names the variant. ``variants=False``: `operands` alone (the in-process tuners,
    which would otherwise JIT-build kernels of a dtype the process does not run).
    """
    passed, rejected = _gate_once(cands, operands, catch=catch, deadline=deadline)
    for variant in (operands.variants if variants else ()):
        ok_before = {c.id for c in passed}
        p2, r2 = _gate_once(cands, variant, catch=catch, deadline=deadline)
        ok_here = {c.id for c in p2}
        for cid, why in r2.items():
            if cid in ok_before:
                rejected[cid] = f"{why} ({variant.label or 'a variant of the operands'})"
        passed = [c for c in passed if c.id in ok_here]
    return passed, rejected


def _gate_once(cands: Sequence[Candidate], operands: Operands, *, catch: bool = False,
               deadline: float | None = None) -> tuple[list[Candidate], dict[str, str]]:
    """`gate_candidates` on `operands` alone (its variants are not looked at).

    The tolerance gate compares with the operands' float64 reference and the baseline's own error
    (`stats.numeric_gate`); the baseline is gated too (it passes against itself unless it is not finite). The
    bitwise gate compares with the baseline's output; the baseline itself is the reference and passes, and a
    candidate whose bitwise baseline was rejected (listed before it) is rejected too (the fp8 family's order groups).
    ``catch``: a candidate that raises (cannot build or run here) is left out instead of failing the call.
    ``deadline`` (time.monotonic): stop gating when it has passed (the candidates gated so far are returned).
    """
    from .stats import numeric_gate

    by_id = {c.id: c for c in cands}
    base_out: dict[str, Any] = {}
    ref64: Any = None
    for c in cands:  # the baselines' outputs and the reference first, as the gate reads them
        b = c.gate.baseline
        if b not in base_out:
            if b not in by_id:
                raise ValueError(f"candidate {c.id}: its gate's baseline {b!r} is not a candidate")
            base_out[b] = by_id[b].make_call(operands)()
        if c.gate.kind == "tolerance" and ref64 is None:
            if operands.reference is None:
                raise ValueError(f"candidate {c.id}: a tolerance gate needs the operands' float64 reference")
            ref64 = operands.reference()
    passed: list[Candidate] = []
    rejected: dict[str, str] = {}
    for c in cands:
        if deadline is not None and time.monotonic() > deadline:
            break
        if c.gate.kind == "bitwise" and c.id == c.gate.baseline:
            passed.append(c)
            continue
        try:
            out = c.make_call(operands)()
        except Exception:
            if not catch:
                raise
            continue
        if c.gate.kind == "bitwise" and c.gate.baseline in rejected:
            ok, why = False, f"its bitwise baseline {c.gate.baseline} was rejected"
        elif c.gate.kind == "bitwise":
            ok = same_bits(out, base_out[c.gate.baseline])
            why = "" if ok else f"not bitwise equal to the {c.gate.baseline}'s tile"
        else:
            ok, why = numeric_gate(out, ref64, base_out[c.gate.baseline], factor=c.gate.factor)
        if ok:
            passed.append(c)
        else:
            rejected[c.id] = why
    return passed, rejected


# Host issue cost is priced on one small problem per family (the launch path, not the math, is what it
# measures): M=16, N=K=256 of the family's first op, or the (N, K) its ``host_probe`` handler names (conv1d: K is
# a kernel width).
HOST_PROBE_M, HOST_PROBE_NK = 16, 256


def host_costs(family: str, arch: str, device: Any = "cuda", iters: int = 500) -> dict[str, float]:
    """Eager per-call host cost (µs) of each host class the family's candidates are charged (``torch``,
    ``oasr``), each timed on the first candidate of that class; {} when the family charges none."""
    from . import bench
    from ..runtime.database import signature

    spec = registry.get(family)
    op = spec.ops[0]
    probe = spec.handler("host_probe")
    n, k = probe() if probe is not None else (HOST_PROBE_NK, HOST_PROBE_NK)
    sig = signature(family, op, "half", n, k)
    parts = parts_of(sig)
    cands = candidates_for(parts, arch)
    firsts: dict[str, Candidate] = {}
    for c in cands:
        if c.host is not None:
            firsts.setdefault(c.host, c)
    if not firsts:
        return {}
    p = Point(HOST_PROBE_M, signature=sig, family=family, op=op, dtype=parts.dt or "half", n=parts.n, k=parts.k)
    ops = operands_for(p, device, 0)
    return {cls: bench.host_overhead_us(c.make_call(ops), iters) for cls, c in firsts.items()}
