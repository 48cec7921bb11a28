"""The deployment's tuning settings: `TuningConfig` and the strict mode's `UncoveredPointsError`.

Here (the tools layer) rather than in `oasr_ops.tuning` because `oasr_ops.tune.prewarm` and the backend read
them; `oasr_ops.TuningConfig` / `oasr_ops.UncoveredPointsError` re-export them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

_MODES = ("off", "prewarm")


@dataclass(frozen=True)
class TuningConfig:
    """How a deployment treats GEMM points the tuning DB does not cover.

    mode:     ``off`` (serve what the DB / fallbacks say) or ``prewarm`` (measure the uncovered must-tune
              points into the user tier before anything is compiled; nothing to measure on a CPU).
    budget_s: wall-clock budget for that measuring, seconds.
    strict:   raise `UncoveredPointsError` (naming the points) rather than run an uncovered must-tune point on
              a fallback. Checked after prewarm measured what it could.
    """

    mode: str = "off"
    budget_s: float = 120.0
    strict: bool = False

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"TuningConfig.mode must be one of {_MODES}, got {self.mode!r}")
        if not isinstance(self.strict, bool):  # a string such as "no" would otherwise read as True
            raise ValueError(f"TuningConfig.strict must be True or False, got {self.strict!r}")
        if not (isinstance(self.budget_s, (int, float)) and self.budget_s >= 0):
            raise ValueError(f"TuningConfig.budget_s must be a non-negative number, got {self.budget_s!r}")


def as_tuning_config(tuning: Any, what: str, default_mode: str = "off") -> TuningConfig:
    """`tuning` as a TuningConfig: one as is, a dict of its fields, None -> ``TuningConfig(mode=default_mode)``;
    TypeError (naming `what`) for anything else. What the backend's ``options={"tuning": ...}`` and `prewarm` take."""
    if tuning is None:
        return TuningConfig(mode=default_mode)
    if isinstance(tuning, dict):
        try:
            return TuningConfig(**tuning)
        except TypeError as e:  # an unknown field
            raise TypeError(f"{what}: {e}; the fields are {[f.name for f in fields(TuningConfig)]}") from None
    if not isinstance(tuning, TuningConfig):
        raise TypeError(f"{what} must be an oasr_ops.TuningConfig or a dict of its fields, got "
                        f"{type(tuning).__name__}")
    return tuning


class UncoveredPointsError(RuntimeError):
    """strict tuning: must-tune GEMM points that no DB tier (user/system) covers."""

    def __init__(self, points: list[Any]) -> None:
        self.points = list(points)
        shown = ", ".join(f"{p.signature} M={p.m}" for p in self.points[:20])
        more = f" (+{len(self.points) - 20} more)" if len(self.points) > 20 else ""
        super().__init__(f"{len(self.points)} must-tune GEMM point(s) not covered by the tuning DB "
                         f"(user/system tier): {shown}{more}. Run `oasr tune build`, "
                         "TuningConfig(mode='prewarm') on a GPU, or drop strict=True to use fallbacks.")
