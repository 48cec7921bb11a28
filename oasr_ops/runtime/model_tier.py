"""The cost-model tier (spec "The cost model"): what an uncovered shape gets before the family's untuned policy.

For a shape no DB tier covers, the tier ranks this process's compiled configs of the native lane (the production
set) and ``torch`` (cuBLAS) with `cost_model.choose`, and answers a CUTLASS config only where the model predicts it
beats cuBLAS by more than the gate; otherwise ``torch``. Reported as tier ``model``; ``OASR_TUNE_MODEL_FALLBACK=0``
turns it off (then the family's policy answers, e.g. the lane default).

Why cuBLAS is the default answer: measured on the H200 (docs/perf/cost_model.md), the lane default served
uncovered widths at 0.64x cuBLAS geomean (0.22x at worst), while the best CUTLASS config beats cuBLAS by more than
10 % only at a few large shapes. A wrong ``torch`` costs at most that margin; a wrong CUTLASS pick can cost 2-5x.

Parameters, per (family, arch): the ``model`` section of the tuning file (`database.model_params`, written by
`oasr tune build`: per-config coefficients + a fitted cuBLAS efficiency curve). With no calibration the structure
alone ranks, with a wider gate (its errors are larger: 12 % top-1 regret on the H200 build log vs 3.5 % calibrated).
The profile is the arch's reference SKU from the static table (`arch_profile.reference_profile`), so a CPU compile
server resolves exactly as the GPU would: selection must not depend on which machine asks.

Deterministic and side-effect free; memoised by the selector per (shape, epoch). Never raises: a broken model
section is warned about once by the caller (select's plug-in guard) and the tier steps aside.
"""
from __future__ import annotations

import functools
import math
from typing import Any

from ..configs import SENTINELS, Config, ConfigError, Lane
from . import arch_profile, cost_model, database, registry

# The decision rule, chosen on the H200 build log by leave-one-signature-out (benchmarks/cost_model_rule.py,
# docs/perf/cost_model.md) before any held-out width was measured: a CUTLASS config must be predicted to beat
# cuBLAS by the gate (T_torch > (1 + gate) * T_best) AND the shape must be compute-bound enough for the structure
# to be trusted (predicted cuBLAS time >= MIN_TORCH_US). Below that the model's errors are as large as the wins
# (its worst misses, 0.76x cuBLAS, were at 5-10 us shapes); the LOSO result of this rule: 1.012x cuBLAS geomean,
# 0.944x at worst, 3.8 % regret vs the measured oracle (gate 0.10 without the floor: 1.025x, 0.763x worst).
GATE_CALIBRATED = 0.20
GATE_UNCALIBRATED = 0.30
MIN_TORCH_US = 30.0

def _rungs() -> tuple[int, ...]:
    """M values the tier answers at (the spec's bucket edges: step 8 up to 128, x sqrt(2) up to 1024, x2 up to
    2^24). A call's M is rounded up to the next rung (M above the last takes the last), so the tier's answer is a
    step function of M that a compiled graph can bake as a region table (`runtime.select.region_table`)."""
    out = list(range(8, 129, 8))
    m = 128.0
    while m < 1024:
        m *= 2 ** 0.5
        out.append(min(1024, int(-(-m // 8) * 8)))
    m2 = 1024
    while m2 < 1 << 24:
        m2 *= 2
        out.append(m2)
    return tuple(sorted(set(out)))


RUNGS = _rungs()


def rung(m: int) -> int:
    """The rung M is answered at: the smallest rung >= M, or the last one."""
    for r in RUNGS:
        if r >= m:
            return r
    return RUNGS[-1]


@functools.lru_cache(maxsize=64)
def _calibration(family: str, arch: str, epoch: int) -> cost_model.Calibration | None:
    raw = database.model_params(family, arch)
    if not isinstance(raw, dict) or raw.get("kind") != cost_model.MODEL_KIND:
        return None  # no model section, or another tool's parameters: the structure alone ranks
    return cost_model.from_json(raw)  # ValueError on a malformed section of ours: the selector warns, skips the tier


def candidate_ids(lane: Lane, arch: str, n: int, k: int, dtype: str | None = None) -> list[str]:
    """The lane's configs this process compiles (the family's production set) that can serve (N, K) here."""
    spec = registry.get(lane.family)
    if spec.production_ids is not None:
        ids = sorted(spec.production_ids(arch))
    else:
        ids = [lane.default.id, *(c.id for c in lane.coverage_basis)]
        ids += [c for c in database.referenced_configs(lane.family, arch) if c not in SENTINELS and c not in ids]
    out = []
    for cid in ids:
        try:
            cfg = lane.get(cid)
        except ConfigError:
            continue
        if lane.infeasible_reason(cfg, n=n, k=k, arch_family=arch, dtype=dtype) is None:
            out.append(cid)
    return out


def choose(family: str, op: str, lane: Lane | None, m: int, n: int, k: int, dtype: Any, arch: str) -> str | None:
    """The model tier's answer for one shape: a config id of `lane`, ``torch``, or None (no opinion: no lane)."""
    if lane is None:
        return None
    # One evaluation per rung (and DB epoch): every M of a rung gets the same answer, so a stream of distinct Ms
    # (a dynamic-shape server) costs one model evaluation per rung, not one per M.
    return _choose_at_rung(family, op, lane.name, rung(max(int(m), 1)), n, k, arch_profile.normalize_dtype(dtype),
                           arch, database.epoch())


@functools.lru_cache(maxsize=65536)
def _choose_at_rung(family: str, op: str, lane_name: str, m: int, n: int, k: int, dt: str, arch: str,
                    epoch: int) -> str:
    lane = registry.get_lane(lane_name)
    cal = _calibration(family, arch, epoch)
    ids = candidate_ids(lane, arch, n, k, dt if dt in ("fp16", "bf16") else None)
    if not ids:
        return "torch"
    gate = GATE_CALIBRATED if cal is not None else GATE_UNCALIBRATED
    profile = arch_profile.reference_profile(arch)
    act = op.endswith("activation")
    if cost_model.predict_us("torch", m, n, k, dt, profile, cal, activation=act) < MIN_TORCH_US:
        return "torch"
    # Every M of the rung gets this answer, not only the rung: a config whose waves fit the rung exactly (rungs
    # are powers of two above 1024) can run a nearly empty last wave a few rows further down. Only configs
    # predicted not to lose to cuBLAS anywhere in the rung's interval may answer (measured on the H200: the
    # 256x128 tile the model chose at M=16384 served M=12000 at 0.95x cuBLAS; docs/perf/cost_model.md).
    lo = _previous_rung(m)
    ids = [c for c in ids if _worst_speedup(lane.get(c), lo, m, n, k, dt, profile, cal, act) >= 1.0]
    return cost_model.choose(ids, m, n, k, dt, profile, cal, gate, activation=act)


def _previous_rung(m: int) -> int:
    i = RUNGS.index(m) if m in RUNGS else len(RUNGS)
    return RUNGS[i - 1] if i > 0 else 0


def _worst_speedup(cfg: Config, lo: int, hi: int, n: int, k: int, dt: str, profile: arch_profile.ArchProfile,
                   cal: cost_model.Calibration | None, act: bool) -> float:
    """min over M in (lo, hi] of predicted T_torch / T_cfg, taken at the Ms just past the config's wave edges
    (`cost_model.probe_ms`)."""
    worst = math.inf
    for m in cost_model.probe_ms(cfg, lo, hi, n, dt, profile):
        t_c = cost_model.predict_s(cfg, m, n, k, dt, profile, cal, activation=act)
        t_t = cost_model.predict_s("torch", m, n, k, dt, profile, cal, activation=act)
        worst = min(worst, t_t / t_c if t_c > 0 else 0.0)
    return worst
