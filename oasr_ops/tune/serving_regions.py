"""Regions for graphs that run without CUDA graphs (``regions_eager``): the same measurements, the eager objective.

Why: a shipped entry is partitioned on GPU time alone, the objective of a captured graph, where issuing a call costs
nothing. A graph compiled without CUDA graphs (serving variable-length traffic, ``mode="default"``) pays each call's
host time, and at small M every GEMM is launch-bound: the GPU finishes a 4-8 us GEMM before the host has issued the
next op. There the measured 0.5 us by which cuBLAS beats a small tile does not reach the wall clock, but the torch
arm's host cost does: on the H200's host `oasr::gemm` served by the C++ hot path costs 11.6 us per call on a kernel
and 18.9 us on its torch arm, plus a second launch for a fused activation (docs/perf/e2e.md, "The C++ hot path of
the int8 GEMMs and the depthwise conv"). The Conformer served one utterance per batch ran every one of its 80
`oasr::gemm` calls on the torch arm (session 14's profile, benchmarks/logs/sm90_e2e_serving_cpp_diag_s14.json).

The rule (per-call time = max(GPU time, host time), the stream being host-bound where the GPU time is below the
host time): inside a region the graph table serves with the fallback (``torch``), each measured point p serves the
Ms from the previous measured point up to p (round-up, as the regions do) with its fastest measured CUTLASS config c
when ``T_c(p) <= HOST_FLOOR_S``: then max(T_c, h_kernel) <= h_torch <= max(T_torch, h_torch), because the kernel
arm issues in less host time than the torch arm (h_kernel < h_torch) and HOST_FLOOR_S is the torch arm's host time
per call on the host the file's GPU times were measured on. A tile's time does not grow as M shrinks, so what holds at
p holds below it. (In that model a tile of up to h_torch wins even where cuBLAS takes half its GPU time: the stream is
taken to be host-bound there. A host whose torch arm costs less re-derives the field with its own time, below.) Where
the tile takes longer than that the GPU time counts and the graph table's answer stands, with the gate and the wave
guard it was partitioned with (a measured point alone is no evidence between points there). Ms past a region's last
measured point are rounded up to the next measured point above the region (the first one of the next region) and
judged there; past the largest measured M the fallback stays. Regions served by a config are kept as they are (their
host cost is the smaller one already): only the fallback ``torch`` is re-read, the arm with the larger host cost.
The catch-all row is read the same way up to the largest measured M: an entry whose every region is cuBLAS (a site
a captured graph keeps on aten) can still have launch-bound points a tile serves. Such a site then runs through
`oasr::gemm` at every M, its torch arm included (measured on the H200: docs/perf/e2e.md, "Eager regions").

The build writes ``regions_eager`` only when its points were measured for captured graphs (every eager fraction 0):
a census recorded without CUDA graphs charges host time in the objective itself, and its regions already are the
eager answer. `oasr tune serving-regions` (tune/serving_regions_cli.py) derives the field for an existing file
from its evidence.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..configs import SENTINELS, ConfigError, parse
from ..runtime import registry
from ..runtime.database import parse_signature

__all__ = ["HOST_FLOOR_S", "eager_regions", "with_eager_regions", "build_step"]

#: Below this GPU time a GEMM is taken to be launch-bound: the torch arm's host time per call through the C++ hot
#: path on the host the shipped files were measured on (the H200 machine: 18.9 us in session 15, 20.1 us in session
#: 17; `benchmarks/host_overhead.py --device cuda --hot-path`, row gemm_torch_arm). Measured end to end there
#: (docs/perf/e2e.md, "The eager floor"): floors of 8 / 12 / 19 us served batch-4 requests 1.07x / 1.20x / 1.33x of
#: Inductor. A host whose torch arm costs less (a faster CPU) re-derives its files with that time: `oasr tune
#: serving-regions --floor-us`.
HOST_FLOOR_S = 19.0e-6


def _point_times(evidence: Mapping[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """[(M, {arm: median_s})] ascending, from an entry's ``evidence`` (``"M=<m>": {arm: [median, sigma, n]}``);
    malformed points and fields are skipped (the rule then has less to go on, never more)."""
    out = []
    for key, row in evidence.items():
        digits = key[2:] if isinstance(key, str) and key.startswith("M=") else ""
        if not (digits.isascii() and digits.isdigit() and isinstance(row, Mapping)):
            continue
        times = {}
        for arm, v in row.items():
            if isinstance(arm, str) and not arm.startswith("_") and isinstance(v, Sequence) and v:
                t = v[0]
                if type(t) in (int, float) and 0 < t < float("inf"):
                    times[arm] = float(t)
        out.append((int(digits), times))
    return sorted(out)


def _is_config(arm: str) -> bool:
    if arm in SENTINELS:
        return False
    try:
        parse(arm)
    except ConfigError:
        return False
    return True


def eager_regions(regions: Sequence[Sequence[Any]], evidence: Mapping[str, Any], fallback: str = "torch",
                  floor_s: float = HOST_FLOOR_S) -> list[list[Any]]:
    """`regions` with the launch-bound stretches of each ``fallback`` region handed to the fastest measured config
    (module doc); a new list, adjacent rows with the same config merged. The measured arms are the build's, so of
    the file's lane; the reader checks every id again."""
    points = _point_times(evidence)
    out: list[list[Any]] = []

    def launch_bound(times: Mapping[str, float]) -> str:
        """The fastest measured config at a point if it is launch-bound there, else the fallback."""
        best = min(((t, arm) for arm, t in times.items() if arm != fallback and _is_config(arm)), default=None)
        return best[1] if best is not None and best[0] <= floor_s else fallback

    def add(hi: Any, cfg: str) -> None:
        if out and out[-1][1] == cfg:
            out[-1][0] = hi
        else:
            out.append([hi, cfg])

    lo = 0
    for hi, cfg in regions:
        if cfg != fallback:
            add(hi, cfg)
            lo = hi if hi is not None else lo
            continue
        prev = lo
        for m, times in points:
            if lo < m and (hi is None or m <= hi):
                add(m, launch_bound(times))
                prev = m
        if hi is None:
            add(None, fallback)
        elif prev < hi:  # round up to the next measured point, in whichever region it lies
            above = next((times for m, times in points if m > hi), None)
            add(hi, fallback if above is None else launch_bound(above))
        lo = hi if hi is not None else lo
    return out


def with_eager_regions(entry: Mapping[str, Any], fallback: str = "torch", floor_s: float = HOST_FLOOR_S
                       ) -> dict[str, Any]:
    """The entry with ``regions_eager`` set where it differs from ``regions`` (and removed where it does not)."""
    out = dict(entry)
    out.pop("regions_eager", None)
    regions = entry.get("regions")
    evidence = entry.get("evidence")
    if isinstance(regions, list) and isinstance(evidence, Mapping):
        eager = eager_regions(regions, evidence, fallback, floor_s)
        if eager != [list(r) for r in regions]:
            out["regions_eager"] = eager
    return out


def build_step(entry: Mapping[str, Any], sig: str, charged: bool) -> dict[str, Any]:
    """What the build (and ``--from-log``) does with a partitioned entry: `with_eager_regions` for a family that
    asks for it (`FamilySpec.eager_regions`), unless ``charged`` — the objective already added host time (some
    point was measured for calls issued without CUDA graphs), so the regions are the eager answer already."""
    parts = parse_signature(sig)
    if charged or parts is None or not registry.get(parts.family).eager_regions:
        return dict(entry)
    return with_eager_regions(entry)

