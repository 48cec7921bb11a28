"""The deployment's tuning settings: `TuningConfig` and the strict mode's `UncoveredPointsError`.

Here (the tools layer) rather than in `oasr_ops.tuning` because `oasr_ops.tune.prewarm` and the backend read
them; `oasr_ops.TuningConfig` / `oasr_ops.UncoveredPointsError` re-export them.
"""
from __future__ import annotations

from dataclasses import dataclass
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
        if not (isinstance(self.budget_s, (int, float)) and self.budget_s >= 0):
            raise ValueError(f"TuningConfig.budget_s must be a non-negative number, got {self.budget_s!r}")


class UncoveredPointsError(RuntimeError):
    """strict tuning: must-tune GEMM points that no DB tier (user/system) covers."""

    def __init__(self, points: list[Any]) -> None:
        self.points = list(points)
        shown = ", ".join(f"{p.signature} M={p.m}" for p in self.points[:20])
        more = f" (+{len(self.points) - 20} more)" if len(self.points) > 20 else ""
        super().__init__(f"{len(self.points)} must-tune GEMM point(s) not covered by the tuning DB "
                         f"(user/system tier): {shown}{more}. Run `oasr tune build`, "
                         "TuningConfig(mode='prewarm') on a GPU, or drop strict=True to use fallbacks.")
