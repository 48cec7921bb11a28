"""The serving rules' checks on a concrete config id (`select.serve_config` applies them to every answer): whether
the family serves the id it was handed, and what its policy serves instead. Pure functions of the family's spec,
its native lane and the call; `runtime/select.py` documents the rules.
"""
from __future__ import annotations

from typing import Any

from ..configs import ConfigError
from . import registry as _registry

MEASURED_TIERS = ("user", "system", "autotune")  # an autotune() result was measured in this process too
POLICY_NAMES = {"heuristic": "the heuristic", "default": "the lane default", "torch": "torch"}


def policy_answer(spec: _registry.FamilySpec, lane: Any, m: int, n: int, k: int, arch: str) -> str:
    """What the family's policy serves an untuned call (and a call whose selected id a serving rule refused)."""
    if spec.policy == "heuristic" and spec.heuristic is not None:
        return spec.heuristic(lane, m, n, k, arch)
    return "torch" if spec.policy == "torch" else lane.default.id


def refusal(spec: _registry.FamilySpec, lane: Any, op: str, cfg: str, tier: str, arch: str) -> str | None:
    """Why the serving rules refuse a concrete id `cfg` chosen by `tier` (None: served)."""
    try:
        c = lane.get(cfg)
    except ConfigError:
        return f"{cfg} is not a config of lane {lane.name}"
    if c.kernel_schedule == "streamk":
        if op in spec.no_streamk_ops:
            return f"{cfg} is a Stream-K tile and there is no Stream-K launcher for {op}"
        if spec.streamk_measured_only and tier not in MEASURED_TIERS:
            return f"Stream-K tile {cfg} did not come from a measured entry"
    if spec.production_ids is not None and cfg not in spec.production_ids(arch):
        return f"{cfg} is outside this process's production set"
    return None
