"""Runtime tuning controls: `TuningConfig`, `reload_tuning()`, `prewarm()`, `tuning_report()`."""
from __future__ import annotations

import contextlib
import io
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


def reload_tuning() -> int:
    """New DB epoch + forget resolved plans + drop compiled graphs, so compiled and eager calls agree.

    Returns the new epoch. The next call of a compiled model recompiles; the pass's uuid carries the DB hash,
    so an FX-graph cache entry compiled against the old DB is not reused.
    """
    import torch

    from .runtime import database, registry

    epoch = database.reload()
    for spec in registry.families().values():  # every family's plan cache (keyed by epoch too)
        reset = spec.handler("reset_plans")
        if reset is not None:
            reset()
    torch.compiler.reset()
    return epoch


def prewarm(model: Any, example_inputs: Any, tuning: TuningConfig | None = None, **kw: Any):
    """Measure the model's uncovered must-tune GEMM points into the user tier (see `oasr_ops.tune.prewarm`)."""
    from .tune.prewarm import prewarm as _prewarm

    return _prewarm(model, example_inputs, tuning=tuning, **kw)


def family_lines(epoch: int | None = None) -> list[str]:
    """One line per kernel family over the graphs the backend rewrote in the current DB epoch."""
    from .inductor.rewrite import rewrite_log
    from .runtime import database

    ep = database.epoch() if epoch is None else epoch
    fams: dict[str, dict[str, Any]] = {}
    for res in rewrite_log():
        if res.epoch != ep:
            continue
        for s in res.sites:
            f = fams.setdefault(s.family, {"ops": 0, "sigs": set(), "tiers": {}})
            f["ops"] += 1
            f["sigs"].add(database.signature(s.family, s.op, "half", s.n, s.k))
            f["tiers"][s.tier] = f["tiers"].get(s.tier, 0) + 1
    lines = []
    for fam, f in sorted(fams.items()):
        tuned = {t: c for t, c in f["tiers"].items() if t in ("user", "system")}
        other = {t: c for t, c in f["tiers"].items() if t not in ("user", "system")}
        fmt = lambda d: ", ".join(f"{t}={c}" for t, c in sorted(d.items()))  # noqa: E731
        lines.append(f"{fam}: {f['ops']} op(s) over {len(f['sigs'])} signature(s) in compiled graphs: "
                     f"{sum(tuned.values())} with a tuning entry ({fmt(tuned) or 'none'}), "
                     f"{sum(other.values())} on a fallback ({fmt(other) or 'none'})")
    if not lines:
        lines.append("gemm: 0 op(s) in compiled graphs (nothing rewritten in this DB epoch)")
    return lines


def tuning_report(print_: bool = True) -> str:
    """The selector's per-tier report, then one line per family for the compiled graphs; printed and returned."""
    from .runtime import select

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        select.tuning_report(print_=True)
    text = buf.getvalue().rstrip("\n") + "\n" + "\n".join(family_lines())
    if print_:
        print(text)
    return text
