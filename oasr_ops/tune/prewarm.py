"""`TuningConfig(mode="prewarm")`: measure the uncovered must-tune GEMM points into the user tier before capture.

`prewarm(model, example_inputs, tuning, census=None)`:

1. points: the must-tune points of ``census`` (a census JSON path or document from ``oasr tune census``) when
   given, else the model traced once at ``example_inputs``' shapes through the backend's rewrite (the census
   tracer; FakeTensors, no compute) — every site reached is must-tune.
2. coverage: a point is covered when `select_config`'s tier is ``user`` or ``system``.
3. measuring (mode ``prewarm``, on a GPU of the DB's arch only), within ``budget_s`` (`run_within_budget`):
   every candidate kernel the points need is compiled first, in parallel (`compile_candidates`: codegen.jit's
   build_many with the prebuild job budget) — the compile time counts against the budget; then the points are
   measured in descending traffic weight until the budget is spent (it is overrun by at most the one point
   being measured when it runs out). A point left unmeasured is served by the cost-model tier. The winners
   are published into the user tier as regions WITHOUT a
   catch-all (``[[M, winner], ...]``, merged point-wise: autotune-style, a size above the largest measured one
   falls through), then `reload_tuning()` (from the backend: DB reload + plan reset only — compiled graphs cannot
   be reset while Dynamo is compiling). On a CPU nothing is measured and the report says so.
4. strict: any point still uncovered raises `UncoveredPointsError` naming them.

`measure_points` (the same, returning only the winners) times with the shared bench protocol (oasr_ops.tune.bench): it takes the points (of any family
with a candidate factory, `oasr_ops.tune.candidates`) and a budget and returns
``{(signature, dtype, m): (config, seconds)}``; one budget covers every family; nothing else here knows how
timing works.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import paths as _paths
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
    compiled: list[str] = field(default_factory=list)        # kernels compiled up front (already built: not listed)
    compile_failed: dict[str, str] = field(default_factory=dict)
    compile_s: float = 0.0                                    # counted against budget_s
    measure_s: float = 0.0
    left_to_model: list[Point] = field(default_factory=list)  # uncovered, not measured: the cost-model tier serves them

    def __str__(self) -> str:
        return (f"prewarm: {len(self.points)} must-tune point(s), {len(self.covered)} covered by the DB; "
                f"compiled {len(self.compiled)} kernel(s) in {self.compile_s:.1f}s, "
                f"measured {len(self.measured)} point(s) in {self.measure_s:.1f}s, "
                f"{len(self.left_to_model)} left to the model, {len(self.uncovered)} uncovered"
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
    from .census_file import load_census, must_tune_points, point_m

    out = []
    for sig, meta, p in must_tune_points(load_census(doc)):
        missing = [key for key in ("family", "op", "n", "k") if key not in meta]
        if missing:
            raise ValueError(f"prewarm: census signature {sig!r} lacks {', '.join(missing)} (write the census with "
                             "`oasr tune census`)")
        for dt in meta.get("dtypes") or ["fp16"]:
            out.append(Point(point_m(p), float(p.get("weight", 0.0)), signature=sig, family=meta["family"],
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
    from .census import describe_inputs, trace_sites

    args = describe_inputs(example_inputs)
    tensor_idx = [i for i, a in enumerate(args) if isinstance(a, tuple)]
    scalars = {i: a for i, a in enumerate(args) if not isinstance(a, tuple)}

    def fn(*tensors: Any) -> Any:
        full, it = [], iter(tensors)
        for i in range(len(args)):
            full.append(next(it) if i in tensor_idx else scalars[i])
        return gm(*full)

    res, _env, _f = trace_sites(fn, [args[i] for i in tensor_idx])
    return _points_from_sites(res.sites)


# ---------------------------------------------------------------------------------------------------- coverage

def is_covered(p: Point, arch: str | None = None) -> bool:
    from ..runtime.select import select_config

    return select_config(p.family, p.op, p.dtype, p.n, p.k, p.m, arch).tier in ("user", "system")


# ---------------------------------------------------------------------------------------------------- measuring

Key = tuple[str, str, int]  # (signature, dtype, m)


@dataclass
class BudgetRun:
    """What `run_within_budget` did: the winners, the compile report and where the seconds went."""

    measured: dict[Key, tuple[str, float]] = field(default_factory=dict)
    compiled: list[str] = field(default_factory=list)
    compile_failed: dict[str, str] = field(default_factory=dict)
    compile_s: float = 0.0
    measure_s: float = 0.0
    attempted: list[Point] = field(default_factory=list)  # in the order measured (descending weight)
    left: list[Point] = field(default_factory=list)  # no winner: not reached in the budget, or nothing passed


def run_within_budget(points: Sequence[Point], budget_s: float, *,
                      compile_fn: Callable[[Sequence[Point]], Any],
                      measure_fn: Callable[[Point, float], "tuple[str, float] | None"],
                      clock: Callable[[], float] = time.monotonic) -> BudgetRun:
    """The budget accounting, independent of how kernels are compiled and points timed.

    ``compile_fn(points)`` compiles every kernel they need (returns an object with ``built`` and ``failed``, as
    codegen.jit.BuildReport); its time counts against `budget_s`. Then points are measured heaviest first
    (``measure_fn(point, deadline)``; ties keep the given order) while the clock is before the deadline, so the
    budget is overrun by at most the one measurement running when it expires."""
    run = BudgetRun()
    t0 = clock()
    deadline = t0 + budget_s
    order = sorted(points, key=lambda p: -p.weight)
    rep = compile_fn(order) if order else None
    t1 = clock()
    run.compile_s = t1 - t0
    if rep is not None:
        run.compiled = list(getattr(rep, "built", []))
        run.compile_failed = dict(getattr(rep, "failed", {}))
    for p in order:
        if clock() >= deadline:
            break
        run.attempted.append(p)
        win = measure_fn(p, deadline)
        if win is not None:
            run.measured[(p.signature, p.dtype, p.m)] = win
    run.measure_s = clock() - t1
    run.left = [p for p in order if (p.signature, p.dtype, p.m) not in run.measured]
    return run


def _kernel_dtype(p: Point) -> str:
    return p.dtype if p.dtype in ("fp16", "bf16") else "fp16"


def candidate_specs(points: Sequence[Point], arch: str) -> list[Any]:
    """The JitSpecs of every config candidate `measure_point` times at `points` (a pseudo-arm: the tile it
    resolves to there), through each family's ``prebuild_specs`` handler; deduplicated, heaviest first."""
    from .candidates import candidates_for, parts_of
    from ..configs import ConfigError, SENTINELS, parse
    from ..runtime import registry

    want: dict[tuple[str, str], set[str]] = {}
    for p in points:
        spec = registry.get(p.family)
        if spec.handler("candidates") is None or spec.handler("prebuild_specs") is None:
            continue
        for c in candidates_for(parts_of(p.signature), arch):
            if c.prewarm and c.feasible(p) is None:
                cid = c.config_at(p)
                if cid not in SENTINELS:
                    want.setdefault((p.family, _kernel_dtype(p)), set()).add(cid)
    specs: dict[str, Any] = {}
    for (family, dt), ids in sorted(want.items()):
        cfgs = []
        for cid in sorted(ids):
            try:
                cfgs.append(parse(cid))
            except ConfigError:
                continue
        for s in registry.get(family).handler("prebuild_specs")(arch, False, (dt,), configs=cfgs):
            specs.setdefault(s.name, s)
    return sorted(specs.values(), key=lambda s: -s.est_memory)


def compile_candidates(points: Sequence[Point], arch: str, jobs: int | None = None) -> Any:
    """Compile (never load) every candidate kernel of `points` in parallel: codegen.jit.build_many, whose job
    budget is the prebuild's (CPU count, capped by free memory). Returns its BuildReport."""
    from ..codegen.jit import build_many

    return build_many(candidate_specs(points, arch), jobs=jobs, progress=False)


def measure_within_budget(points: Sequence[Point], budget_s: float) -> BudgetRun:
    """`run_within_budget` with the real compile (`compile_candidates`) and measurement (`measure_point`) on
    this GPU; an empty run without a GPU."""
    import torch

    from . import bench
    from ..runtime.arch import current_arch_family

    arch = current_arch_family()
    if not torch.cuda.is_available() or arch is None:
        return BudgetRun(left=list(points))
    bench.refuse_in_capture()
    return run_within_budget(points, budget_s, compile_fn=lambda pts: compile_candidates(pts, arch),
                             measure_fn=lambda p, deadline: measure_point(p, arch, deadline))


def measure_points(points: Sequence[Point], budget_s: float) -> dict[tuple[str, str, int], tuple[str, float]]:
    """Each point's winner among its family's prewarm candidates (gemm: the lane's feasible configs that are in
    the production set, and torch; scaled_mm: every eligible tile and the heuristic's), measured with the shared
    protocol (bench.measure: CUDA graphs of N >= 8 calls, separator kernel subtracted, shuffled interleaved
    rounds, median) after compiling them all up front; heaviest points first until the budget (compile time
    included) runs out. Every candidate passes its numeric gate first. Returns {(signature, dtype, m): (config, s)}.
    """
    return measure_within_budget(points, budget_s).measured


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
    # the timed output dtype only (variants=False): a variant would JIT-build kernels inside the prewarm budget
    passed, _rejected = gate_candidates(cands, ops, catch=True, deadline=deadline, variants=False)
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
    from .config import UncoveredPointsError
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
        elif _paths.user_db_dir() is None:  # measuring would be lost: the winners are served through that tier
            rep.note = "the user tier is disabled (OASR_TUNE_USER_DB=off): nothing measured, nothing to publish into"
            warnings.warn(f"oasr prewarm: {rep.note}; {len(todo)} uncovered point(s) left to the cost-model tier",
                          UserWarning, stacklevel=2)
        else:
            run = measure_within_budget(todo, tuning.budget_s)
            rep.measured = run.measured
            rep.compiled, rep.compile_failed = run.compiled, run.compile_failed
            rep.compile_s, rep.measure_s = run.compile_s, run.measure_s
            try:
                rep.published = publish_winners(rep.measured)
            except (OSError, RuntimeError, TimeoutError) as e:  # an unwritable / unusable user tier: the
                # documented fallback is the cost-model tier for these points, said once; the report keeps them
                rep.note = f"{len(rep.measured)} measured point(s) not published to the user tier ({e})"
                warnings.warn(f"oasr prewarm: {rep.note}; they are left to the cost-model tier", UserWarning,
                              stacklevel=2)
            if rep.published:
                if inside_compile:
                    from ..runtime.reload import reload_tuning

                    reload_tuning(reset_compiled=False)
                else:
                    from ..runtime.reload import reload_tuning

                    reload_tuning()
            if len(run.attempted) < len(todo):
                rep.note = "; ".join(filter(None, (rep.note, (
                    f"budget {tuning.budget_s}s: {len(todo) - len(run.attempted)} point(s) not reached, "
                    "served by the cost-model tier"))))
    rep.uncovered = [p for p in todo if not is_covered(p)]
    rep.left_to_model = [p for p in todo if (p.signature, p.dtype, p.m) not in rep.measured]
    rep.elapsed_s = time.monotonic() - t0
    if tuning.strict and rep.uncovered:
        raise UncoveredPointsError(rep.uncovered)
    return rep


def prewarm(model: Any, example_inputs: Sequence[Any], tuning: Any = None, *, census: Any = None) -> PrewarmReport:
    """See the module docstring. `tuning` defaults to TuningConfig(mode="prewarm"); a dict is TuningConfig's fields
    (as the backend's ``options={"tuning": ...}`` takes it). TypeError for any other `tuning`, and for a bare tensor
    as `example_inputs` (a sequence of inputs: ``(x,)``)."""
    import torch

    from .config import as_tuning_config

    tuning = as_tuning_config(tuning, "prewarm: tuning", default_mode="prewarm")
    if isinstance(example_inputs, torch.Tensor):
        raise TypeError("prewarm: example_inputs must be a sequence of the model's inputs, e.g. (x,), got a tensor")
    pts = points_from_census(census) if census is not None else points_for_model(model, tuple(example_inputs))
    return run_prewarm(pts, tuning)


def prewarm_graph(gm: Any, example_inputs: Sequence[Any], tuning: Any) -> PrewarmReport:
    """The backend's hook, before the graph is compiled."""
    return run_prewarm(points_for_graph(gm, example_inputs), tuning, inside_compile=True)
