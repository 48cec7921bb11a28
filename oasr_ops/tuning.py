"""Runtime tuning controls: `TuningConfig`, `reload_tuning()`, `prewarm()`, `tuning_report()`."""
from __future__ import annotations

import contextlib
import io
from typing import Any

from .tune.config import TuningConfig, UncoveredPointsError  # noqa: F401  (public names: oasr_ops.TuningConfig)

_TUNED = ("user", "system")
_FROM_GRAPH = ("explicit", "baked")  # a plan whose config the compiled graph (or the caller) named


def reload_tuning() -> int:
    """New DB epoch + forget resolved plans + drop compiled graphs, so compiled and eager calls agree.

    Returns the new epoch. The next call of a compiled model recompiles; the pass's uuid carries the DB hash,
    so an FX-graph cache entry compiled against the old DB is not reused.
    """
    from .runtime.reload import reload_tuning as _reload

    return _reload()


def prewarm(model: Any, example_inputs: Any, tuning: TuningConfig | None = None, **kw: Any):
    """Measure the model's uncovered must-tune GEMM points into the user tier (see `oasr_ops.tune.prewarm`)."""
    from .tune.prewarm import prewarm as _prewarm

    return _prewarm(model, example_inputs, tuning=tuning, **kw)


def _fmt(d: dict[str, int]) -> str:
    return ", ".join(f"{t}={c}" for t, c in sorted(d.items())) or "none"


def _graph_lines(results: list[Any], source: str) -> dict[str, str]:
    """family -> one line over the sites of `results` (compiled graphs), tagged with where they come from."""
    from .runtime import database

    fams: dict[str, dict[str, Any]] = {}
    for res in results:
        for s in res.sites:
            f = fams.setdefault(s.family, {"ops": 0, "sigs": set(), "tiers": {}})
            f["ops"] += 1
            f["sigs"].add(database.signature(s.family, s.op, "half", s.n, s.k))
            f["tiers"][s.tier] = f["tiers"].get(s.tier, 0) + 1
    out = {}
    for fam, f in fams.items():
        tuned = {t: c for t, c in f["tiers"].items() if t in _TUNED}
        other = {t: c for t, c in f["tiers"].items() if t not in _TUNED}
        out[fam] = (f"{fam}: {f['ops']} op(s) over {len(f['sigs'])} signature(s) in compiled graphs: "
                    f"{sum(tuned.values())} with a tuning entry ({_fmt(tuned)}), "
                    f"{sum(other.values())} on a fallback ({_fmt(other)}) [{source}]")
    return out


def _skipped_line(results: list[Any], source: str, shown: int = 4) -> str | None:
    """One line over the sites of `results` that stayed on aten, grouped by reason (the most frequent first, up to
    `shown` of them), tagged like the family lines; None when every site was rewritten. Why: a site left on aten
    (an unaligned width, a strided operand) runs as under Inductor, and a report that only counts rewritten sites
    does not say the model has such sites."""
    reasons: dict[str, int] = {}
    for res in results:
        for node, why in res.skipped:
            if node != "<graph>":  # a cache hit that could not be re-derived: its own line
                reasons[why] = reasons.get(why, 0) + 1
    if not reasons:
        return None
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    text = "; ".join(f"{why} ({n})" for why, n in top[:shown])
    more = f"; {len(top) - shown} more reason(s)" if len(top) > shown else ""
    return f"left on aten: {sum(reasons.values())} site(s): {text}{more} [{source}]"


def _served_lines() -> dict[str, str]:
    """family -> one line over the plans that actually served calls (each family's ``served`` handler: the CUDA
    path's plans since the last reload, with their tier and call count; the CPU reference path makes none)."""
    from .runtime import registry

    out = {}
    for name, spec in registry.families().items():
        served = spec.handler("served")
        plans = list(served()) if served is not None else []
        if not plans:
            continue
        calls = {"tuned": {}, "graph": {}, "fallback": {}}
        for p in plans:
            kind = "tuned" if p.tier in _TUNED else "graph" if p.tier in _FROM_GRAPH else "fallback"
            calls[kind][p.tier] = calls[kind].get(p.tier, 0) + p.calls
        total = sum(p.calls for p in plans)
        out[name] = (f"{name}: {total} call(s) served by {len(plans)} plan(s) over "
                     f"{len({p.signature for p in plans})} signature(s): "
                     f"{sum(calls['tuned'].values())} from a tuning entry ({_fmt(calls['tuned'])}), "
                     f"{sum(calls['graph'].values())} on a config the graph named ({_fmt(calls['graph'])}), "
                     f"{sum(calls['fallback'].values())} on a fallback ({_fmt(calls['fallback'])}) "
                     "[served calls since the last reload]")
    return out


def family_lines(epoch: int | None = None) -> list[str]:
    """Per kernel family, one line per source of truth, each saying which it is:

    * ``rewritten in this process``: the graphs the backend's pass rewrote in the DB epoch (`rewrite_log`);
    * ``FX/AOT cache hit``: graphs compiled from Inductor's caches, where the pass does not run — their sites
      re-derived (`oasr_ops.inductor.rewrite.cache_hit_log`);
    * ``served calls``: the plans that ran calls (each family's ``served`` handler; CUDA only);

    then, per graph source, one ``left on aten`` line counting the sites no family rewrote, by reason.
    """
    from .inductor import rewrite
    from .runtime import database

    ep = database.epoch() if epoch is None else epoch
    passed = [r for r in rewrite.rewrite_log() if r.epoch == ep]
    hits = [r for r in rewrite.cache_hit_log() if r.epoch == ep]  # (the log holds the current epoch's only)
    sources = [
        _graph_lines(passed, f"rewritten in this process: {len(passed)} graph(s)"),
        _graph_lines(hits, f"FX/AOT cache hit: re-derived from {len(hits)} cached graph(s)"),
        _served_lines(),
    ]
    lines = []
    for fam in sorted({f for src in sources for f in src}):
        lines.extend(src[fam] for src in sources if fam in src)
    for results, source in ((passed, "rewritten in this process"), (hits, "FX/AOT cache hit")):
        line = _skipped_line(results, source)
        if line:
            lines.append(line)
    failed = [why for r in hits for node, why in r.skipped if node == "<graph>"]
    if failed:
        lines.append(f"{len(failed)} cached graph(s) could not be re-derived: {failed[0]}")
    if rewrite.cache_hits_dropped():
        lines.append(f"{rewrite.cache_hits_dropped()} more cache-hit graph(s) not recorded (limit reached)")
    if not lines:
        lines.append("no oasr op in compiled graphs or served calls in this DB epoch (nothing rewritten, no "
                     "cache-hit graph recorded, no CUDA plan ran)")
    return lines


def tuning_report(print_: bool = True) -> str:
    """The selector's per-tier report, then the per-family lines (`family_lines`); printed and returned."""
    from .runtime import select_report

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        select_report.tuning_report(print_=True)
    text = buf.getvalue().rstrip("\n") + "\n" + "\n".join(family_lines())
    if print_:
        print(text)
    return text
