"""Statistics of the benchmark protocol: the estimator, its spread, successive halving, the numeric gate.

Spec ("The benchmark protocol"): arms are interleaved in shuffled rounds; the estimator is the median, sigma is
1.4826 x MAD (the MAD scaled to a normal's standard deviation, robust to the occasional preempted sample);
successive halving keeps the default and the incumbent to the end; every candidate first passes a numeric gate
(within 4x cuBLAS's own error, no NaN/Inf).

Everything here is pure: the GPU harness (bench.py) supplies samples through a callable and tensors already
computed; nothing touches torch.cuda. ``numeric_gate`` imports torch lazily and works on CPU tensors too.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAD_TO_SIGMA", "median", "mad", "robust_sigma", "Estimate", "estimate",
    "HalvingResult", "successive_halving", "numeric_gate",
]

#: 1 / Phi^-1(3/4): makes the MAD a consistent estimator of a normal distribution's sigma.
MAD_TO_SIGMA = 1.4826


def median(xs: Iterable[float]) -> float:
    """The median (mean of the two middle values for an even count). ValueError on no samples."""
    s = sorted(float(x) for x in xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of no samples")
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def mad(xs: Iterable[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    s = [float(x) for x in xs]
    med = median(s)
    return median(abs(x - med) for x in s)


def robust_sigma(xs: Iterable[float]) -> float:
    """sigma = 1.4826 x MAD."""
    return MAD_TO_SIGMA * mad(xs)


@dataclass(frozen=True)
class Estimate:
    """One arm at one point: median seconds, robust sigma (seconds), sample count.

    ``as_evidence()`` is the DB's evidence triple ``[median_s, sigma_s, n]``.
    """

    median_s: float
    sigma_s: float
    n: int

    def as_evidence(self) -> list[float | int]:
        return [self.median_s, self.sigma_s, self.n]


def estimate(samples: Sequence[float]) -> Estimate:
    """Median, 1.4826 x MAD and count of ``samples`` (seconds)."""
    xs = [float(x) for x in samples]
    return Estimate(median(xs), robust_sigma(xs), len(xs))


@dataclass
class HalvingResult:
    """Outcome of ``successive_halving``.

    ``samples``: every sample gathered per arm (eliminated arms keep theirs). ``estimates``: ``estimate()`` of
    each arm's samples. ``survivors``: arms still in at the end, fastest median first. ``eliminated_in``: arm ->
    0-based round after which it was cut (absent for survivors). ``best``: the fastest survivor.
    """

    samples: dict[str, list[float]]
    estimates: dict[str, Estimate]
    survivors: list[str]
    eliminated_in: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> str:
        return self.survivors[0]


def successive_halving(
    arms: Sequence[str],
    sample_fn: Callable[[list[str]], Mapping[str, Sequence[float]]],
    rounds: int = 3,
    keep: Iterable[str | None] = ("default",),
    eta: float = 2.0,
    min_survivors: int = 1,
) -> HalvingResult:
    """Successive halving over ``arms`` by median time (lower is better).

    Each round calls ``sample_fn(alive)`` once — the harness interleaves the alive arms in shuffled rounds and
    returns new samples (seconds) per arm — and accumulates them. After every round but the last, the alive arms
    are ranked by the median of all their samples so far; of the n alive arms not in ``keep`` the fastest
    ``max(min_survivors, ceil(n / eta))`` stay. The arms in ``keep`` (the default and the incumbent: the
    fallback the partition gates against, and the config the DB serves today, so a re-tune can always say
    "no change") are never cut. The last round only
    refines the survivors' estimates. Entries of ``keep`` that are None or not among ``arms`` are ignored, so
    ``keep=("default", incumbent)`` works when there is no incumbent.

    An arm ``sample_fn`` returns no samples for (e.g. it failed to launch) ranks last; an arm with no samples at
    the end is dropped from the survivors. Ties rank by position in ``arms`` (deterministic).
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if eta <= 1:
        raise ValueError("eta must be > 1")
    order = {a: i for i, a in enumerate(dict.fromkeys(arms))}
    kept = {k for k in keep if k is not None and k in order}
    samples: dict[str, list[float]] = {a: [] for a in order}
    alive = list(order)
    eliminated: dict[str, int] = {}

    def rank_key(a: str) -> tuple[float, int]:
        s = samples[a]
        return (median(s) if s else math.inf, order[a])

    for r in range(rounds):
        if not alive:
            break
        got = sample_fn(list(alive))
        for a in alive:
            samples[a].extend(float(x) for x in got.get(a, ()))
        if r == rounds - 1:
            break
        ranked = sorted(alive, key=rank_key)
        # The halving counts only the arms that can be cut: counting the kept (usually slow) arms in the
        # top fraction would stop the field from shrinking.
        free = [a for a in ranked if a not in kept]
        n_keep = max(min_survivors, math.ceil(len(free) / eta))
        stay = set(free[:n_keep]) | (kept & set(alive))
        for a in ranked:
            if a not in stay:
                eliminated[a] = r
        alive = [a for a in ranked if a in stay]

    survivors = [a for a in sorted(alive, key=rank_key) if samples[a]]
    estimates = {a: estimate(s) for a, s in samples.items() if s}
    return HalvingResult(samples=samples, estimates=estimates, survivors=survivors, eliminated_in=eliminated)


def _max_abs_err(x: Any, ref: Any) -> float:
    import torch

    return float((x.to(torch.float64) - ref).abs().max().item()) if x.numel() else 0.0


def _widen(t: Any) -> Any:
    """fp8 outputs as float64 (isfinite/isnan have no fp8 kernels); other tensors unchanged."""
    import torch

    if t.is_floating_point() and t.element_size() == 1:
        return t.to(torch.float64)
    return t


def numeric_gate(
    out: Any,
    ref64: Any,
    cublas_out: Any,
    *,
    factor: float = 4.0,
    abs_floor: float = 1e-6,
) -> tuple[bool, str]:
    """Is a candidate's output numerically acceptable? Returns ``(ok, reason)``; reason is "" when ok.

    ``ref64``: the same product computed in float64 (or float32) from the same inputs; ``cublas_out``: cuBLAS's
    (torch's) output in the candidate's dtype. Error = max |x - ref| over all elements, in float64.

    Accept iff ``out`` is all finite, has ``ref64``'s shape, and
    ``err(out) <= factor * max(err(cublas), floor)`` where ``floor = max(abs_floor, eps(out.dtype) * max|ref|)``.
    The floor matters when cuBLAS happens to be exact (small integer-valued inputs, K small): without it every
    candidate that rounds its output differently would fail. It is one output ulp at the output's scale, and
    at least ``abs_floor``.

    A non-finite reference or cuBLAS output fails too (the inputs or the harness are broken, and no candidate
    can be judged against them).
    """
    import torch

    if tuple(out.shape) != tuple(ref64.shape):
        return False, f"shape {tuple(out.shape)} != reference {tuple(ref64.shape)}"
    ref = ref64.detach().to(torch.float64)  # stays on its device: the GPU harness gates without a copy back
    outc = _widen(out.detach().to(ref.device))
    cub = _widen(cublas_out.detach().to(ref.device))
    if not bool(torch.isfinite(ref).all()):
        return False, "reference is not finite"
    if not bool(torch.isfinite(cub).all()):
        return False, "cuBLAS output is not finite"
    finite = torch.isfinite(outc)
    if not bool(finite.all()):
        n_nan = int(torch.isnan(outc).sum())
        n_inf = int((~finite).sum()) - n_nan
        return False, f"non-finite output: {n_nan} NaN, {n_inf} Inf"
    err = _max_abs_err(outc, ref)
    cub_err = _max_abs_err(cub, ref)
    scale = float(ref.abs().max().item()) if ref.numel() else 0.0
    eps = torch.finfo(out.dtype).eps if out.dtype.is_floating_point else 0.0
    floor = max(abs_floor, eps * scale)
    tol = factor * max(cub_err, floor)
    if err > tol:
        return False, (f"max abs error {err:.3g} > {factor:g} x max(cuBLAS error {cub_err:.3g}, floor {floor:.3g})"
                       f" = {tol:.3g}")
    return True, ""
