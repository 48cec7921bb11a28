"""`TuningConfig(mode="prewarm")`: measure the uncovered must-tune GEMM points into the user tier before capture.

`prewarm(model, example_inputs, tuning, census=None)`:

1. points: the must-tune points of ``census`` (a census JSON path or document from ``oasr tune census``) when
   given, else the model traced once at ``example_inputs``' shapes through the backend's rewrite (the census
   tracer; FakeTensors, no compute) — every site reached is must-tune.
2. coverage: a point is covered when `select_config`'s tier is ``user`` or ``system``.
3. measuring (mode ``prewarm``, on a GPU of the DB's arch only): `measure_points(points, budget_s)` times each
   point's candidates and returns the winners; they are published into the user tier as regions WITHOUT a
   catch-all (``[[M, winner], ...]``, merged point-wise: autotune-style, a size above the largest measured one
   falls through), then `reload_tuning()` (from the backend: DB reload + plan reset only — compiled graphs cannot
   be reset while Dynamo is compiling). On a CPU nothing is measured and the report says so.
4. strict: any point still uncovered raises `UncoveredPointsError` naming them.

`measure_points` times with the shared bench protocol (oasr_ops.tune.bench): it takes the points (of any family
with a candidate factory, `oasr_ops.tune.candidates`) and a budget and returns
``{(signature, dtype, m): (config, seconds)}``; one budget covers every family; nothing else here knows how
timing works.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from .points import Point  # signature in the dt=half spelling; dtype: fp16 | bf16


@dataclass
class PrewarmReport:
    points: list[Point] = field(default_factory=list)
    covered: list[Point] = field(default_factory=list)
    uncovered: list[Point] = field(default_factory=list)     # after measuring
    measured: dict[tuple[str, str, int], tuple[str, float]] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)       # paths written
    note: str = ""
    elapsed_s: float = 0.0

    def __str__(self) -> str:
        return (f"prewarm: {len(self.points)} must-tune point(s), {len(self.covered)} covered by the DB, "
                f"{len(self.measured)} measured, {len(self.uncovered)} uncovered"
                + (f" ({self.note})" if self.note else "") + f" in {self.elapsed_s:.1f}s")


# ---------------------------------------------------------------------------------------------------- points

def _points_from_sites(sites: Sequence[Any]) -> list[Point]:
    from . import database

    seen: dict[tuple, Point] = {}
    for s in sites:
        m = s.m if s.m is not None else getattr(s, "m_hint", None)
        if m is None or m <= 0:
            continue
        sig = database.signature(s.family, s.op, "half", s.n, s.k)
        seen.setdefault((sig, s.dtype, m), Point(int(m), signature=sig, family=s.family, op=s.op, dtype=s.dtype,
                                                 n=s.n, k=s.k))
    return list(seen.values())


def points_from_census(doc: Any) -> list[Point]:
    from .census import load_census, must_tune_points

    out = []
    for sig, meta, p in must_tune_points(load_census(doc)):
        for dt in meta.get("dtypes") or ["fp16"]:
            out.append(Point(int(p["m"]), float(p.get("weight", 0.0)), signature=sig, family=meta["family"],
                             op=meta["op"], dtype=dt, n=int(meta["n"]), k=int(meta["k"])))
    return out


def points_for_model(model: Any, example_inputs: Sequence[Any]) -> list[Point]:
    """Trace `model(*example_inputs)` on FakeTensors through the rewrite; every site is a must-tune point."""
    import torch

    from .census import trace_sites

    params = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(params)

    def fn(*args: Any) -> Any:
        return torch.func.functional_call(model, dict(zip(names, args[:len(names)])), tuple(args[len(names):]))

    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise TypeError("prewarm: example_inputs must be a sequence of tensors")
    res, _env, _f = trace_sites(fn, [*params.values(), *example_inputs])
    return _points_from_sites(res.sites)


def points_for_graph(gm: Any, example_inputs: Sequence[Any]) -> list[Point]:
    """The same for a Dynamo graph (the backend's hook); symbolic sizes are taken at their hints."""
    import torch

    from .census import trace_sites

    args = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            shape = tuple(_hint(s) for s in x.shape)
            args.append((shape, x.dtype, x.device))
        else:
            args.append(x)
    tensor_idx = [i for i, a in enumerate(args) if isinstance(a, tuple)]
    scalars = {i: _hint(a) for i, a in enumerate(args) if not isinstance(a, tuple)}

    def fn(*tensors: Any) -> Any:
        full, it = [], iter(tensors)
        for i in range(len(args)):
            full.append(next(it) if i in tensor_idx else scalars[i])
        return gm(*full)

    res, _env, _f = trace_sites(fn, [args[i] for i in tensor_idx])
    return _points_from_sites(res.sites)


def _hint(x: Any) -> Any:
    import torch

    if isinstance(x, torch.SymInt):
        h = x.node.hint
        return int(h) if h is not None else int(x.node.shape_env.size_hint(x.node.expr))
    return x


# ---------------------------------------------------------------------------------------------------- coverage

def is_covered(p: Point, arch: str | None = None) -> bool:
    from ..runtime.select import select_config

    return select_config(p.family, p.op, p.dtype, p.n, p.k, p.m, arch).tier in ("user", "system")


# ---------------------------------------------------------------------------------------------------- measuring

def measure_points(points: Sequence[Point], budget_s: float) -> dict[tuple[str, str, int], tuple[str, float]]:
    """Each point's winner among its family's prewarm candidates (gemm: the lane's feasible configs that are in
    the production set, and torch; scaled_mm: every eligible tile and the heuristic's), measured with the shared
    protocol (bench.measure: CUDA graphs of N >= 8 calls, separator kernel subtracted, shuffled interleaved
    rounds, median); points in order until the budget runs out. Every candidate passes its numeric gate first.
    Returns {(signature, dtype, m): (config, s)}.
    """
    import torch

    from . import bench
    from ..runtime.arch import current_arch_family

    arch = current_arch_family()
    if not torch.cuda.is_available() or arch is None:
        return {}
    bench.refuse_in_capture()
    deadline = time.monotonic() + budget_s
    out: dict[tuple[str, str, int], tuple[str, float]] = {}
    for p in points:
        if time.monotonic() > deadline:
            break
        win = measure_point(p, arch, deadline)
        if win is not None:
            out[(p.signature, p.dtype, p.m)] = win
    return out


def measure_point(p: Point, arch: str, deadline: float | None = None, device: Any = "cuda"
                  ) -> tuple[str, float] | None:
    """The point's winner (config, seconds) among its family's gated prewarm candidates, or None when none
    passes (or the family cannot be measured). A candidate that cannot build or run here is not one. A
    Stream-K tile is eligible here because a prewarm entry is a measured one."""
    from . import bench
    from .candidates import candidates_for, gate_candidates, operands_for, parts_of
    from ..runtime import registry

    spec = registry.get(p.family)
    if spec.handler("candidates") is None or spec.handler("operands") is None:
        return None
    cands = [c for c in candidates_for(parts_of(p.signature), arch) if c.prewarm and c.feasible(p) is None]
    if not cands:
        return None
    ops = operands_for(p, device, seed=p.m)
    passed, _rejected = gate_candidates(cands, ops, catch=True, deadline=deadline)
    if not passed:
        return None
    arms = {c.id: [c.make_call(ops)] * bench.MIN_CALLS for c in passed}
    res = bench.measure(arms, rounds=5)
    cfg, r = min(res.items(), key=lambda kv: kv[1].estimate.median_s)
    return cfg, r.estimate.median_s


def publish_winners(measured: dict[tuple[str, str, int], tuple[str, float]]) -> list[str]:
    """User-tier entries without a catch-all (autotune-style), merged point-wise into what is there."""
    from . import database

    by_sig: dict[str, dict[int, tuple[str, float]]] = {}
    for (sig, _dt, m), (cfg, t) in measured.items():
        cur = by_sig.setdefault(sig, {}).get(m)
        if cur is None or t < cur[1]:
            by_sig[sig][m] = (cfg, t)
    entries: dict[str, dict[str, dict]] = {}
    for sig, pts in by_sig.items():
        family = sig.split("|", 1)[0]
        entries.setdefault(family, {})[sig] = {
            "regions": [[m, cfg] for m, (cfg, _t) in sorted(pts.items())],
            "source": "prewarm",
            "notes": [f"M={m}: {cfg} {t * 1e6:.1f} us (prewarm, bench protocol)" for m, (cfg, t) in sorted(pts.items())]}
    return [str(database.publish(family, ents, tier="user", merge_regions=True)) for family, ents in entries.items()]


# ---------------------------------------------------------------------------------------------------- driver

def run_prewarm(points: Sequence[Point], tuning: Any, *, inside_compile: bool = False) -> PrewarmReport:
    from ..tuning import UncoveredPointsError
    from ..runtime.arch import current_arch_family

    t0 = time.monotonic()
    rep = PrewarmReport(points=list(points))
    rep.covered = [p for p in points if is_covered(p)]
    todo = sorted((p for p in points if not is_covered(p)), key=lambda p: (-p.weight, p.signature, p.m))
    if todo and tuning.mode == "prewarm":
        import torch

        if not torch.cuda.is_available():
            rep.note = "no GPU: nothing to measure on a CPU"
        elif current_arch_family() is None:
            rep.note = "no arch"
        else:
            rep.measured = measure_points(todo, tuning.budget_s)
            rep.published = publish_winners(rep.measured)
            if rep.published:
                if inside_compile:
                    from . import database
                    from ..runtime import registry

                    database.reload()
                    for spec in registry.families().values():  # every family's plan cache
                        reset = spec.handler("reset_plans")
                        if reset is not None:
                            reset()
                else:
                    from ..tuning import reload_tuning

                    reload_tuning()
            if len(rep.measured) < len(todo):
                rep.note = f"budget {tuning.budget_s}s: {len(todo) - len(rep.measured)} point(s) not measured"
    rep.uncovered = [p for p in todo if not is_covered(p)]
    rep.elapsed_s = time.monotonic() - t0
    if tuning.strict and rep.uncovered:
        raise UncoveredPointsError(rep.uncovered)
    return rep


def prewarm(model: Any, example_inputs: Sequence[Any], tuning: Any = None, *, census: Any = None) -> PrewarmReport:
    """See the module docstring. `tuning` defaults to TuningConfig(mode="prewarm")."""
    from ..tuning import TuningConfig

    tuning = tuning or TuningConfig(mode="prewarm")
    pts = points_from_census(census) if census is not None else points_for_model(model, tuple(example_inputs))
    return run_prewarm(pts, tuning)


def prewarm_graph(gm: Any, example_inputs: Sequence[Any], tuning: Any) -> PrewarmReport:
    """The backend's hook, before the graph is compiled."""
    return run_prewarm(points_for_graph(gm, example_inputs), tuning, inside_compile=True)
