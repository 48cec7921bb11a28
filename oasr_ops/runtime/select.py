"""Config selection, the one layer every family uses: (autotune ▸) user ▸ system ▸ model ▸ the family's policy, memoised
per epoch, then the family's serving rules. A family supplies only its policy, through its `FamilySpec`.

`select_config(family, op, dtype, n, k, m, arch=None) -> Selection(config, tier, signature)`:

* The DB tiers are walked as `database.chain` orders them (user/dt-specific, user/half, system/dt-specific,
  system/half); each entry rounds M up to a region and falls through where it does not cover M. A DB config
  that the lane's static feasibility rules reject for (N, K, arch) is warned about once and treated as a hole.
* Then the cost-model tier, tier ``model``: a registered plug-in (`register_cost_model(family, fn)`,
  fn(lane, m, n, k, dtype) -> id | None), else for a family whose spec is ``modelled`` (gemm, bmm) the built-in
  `model_tier` (cuBLAS unless a compiled config is predicted to win; answers on M rungs, which `region_table`
  bakes); ``OASR_TUNE_MODEL_FALLBACK=0`` turns it off. Ahead of every DB tier, while an `oasr_ops.autotune()`
  context is active, its results (tier ``autotune``, installed with `set_autotune`). Then the family fallback: for gemm the native lane's
  default id (the sentinel ``"default"`` where no lane runs), for bmm ``"torch"``, for scaled_mm* a registered
  fallback plug-in (`register_fallback`) or the ``"heuristic"`` sentinel; tier ``default`` / ``heuristic``.
* ``OASR_GEMM_HEURISTIC=0``: every shape of a family whose untuned policy is ``default`` (gemm, conv1d) gets the
  lane default, tier ``default``.
* A region naming a sentinel (``default``/``torch``/``fused``/``heuristic``) is returned as that sentinel.
* ``arch=None`` means the current arch; with no GPU and no ``OASR_ARCH`` the answer is
  ``Selection(spec.no_arch, "default", sig)``.

`serve_config(...)` (same arguments) is what a launcher runs: `select_config`'s answer passed through the
family's serving rules, all driven by its spec — a concrete id of the native lane or ``"torch"``:

* no native lane for the arch (or no arch): ``torch``, tier ``default``;
* ``heuristic`` -> `spec.heuristic`'s tile, keeping the tier (a measured ``heuristic`` region stays measured);
  ``torch``/``fused`` -> ``torch``; ``default`` -> the lane default, then checked like any id:
* refused (runtime/serving_rules.py), each warned about once and replaced by the policy's answer (`spec.heuristic`,
  the lane default or torch; tier `spec.fallback_tier`): an id outside the native lane; a Stream-K tile for an op in
  `spec.no_streamk_ops` or (`spec.streamk_measured_only`) from a tier other than user/system; an id outside
  `spec.production_ids(arch)` (`runtime.production`).

Epochs: environment variables and the DB are read at the first resolution after import or
`database.reload()`; the memo is dropped on reload, so a selection changes only at a reload. A hit is one dict
access (key: family, op, dtype, n, k, m, arch as passed; `serve_config` has a key of its own) plus a counter
increment.

Counting (decision): every CALL is counted under the tier that answered (``recorded per resolution``); the
printed report also gives the number of resolutions per tier (memo misses: one per distinct shape per epoch).
`tuning_report()` returns ``{family: {op: {tier: calls}}}`` (or prints a text table with ``print_=True`` and
returns the text); `resolution_counts(family)` the served resolutions ``{op: {tier: shapes}}``.

`region_table(..., eager=True)` and `eager_answer(...)`: for graphs run without CUDA graphs, each entry's
``regions_eager`` where it has one (tune/serving_regions.py), baked by `families.graph.bake`.
`region_table(...)` merges the tiers into one ``[[m_hi, config], ..., [None, terminator]]`` a compiled graph can
bake; `resolve_in_table(table, m)` is its per-call round-up lookup. The table gives the same answer as
`select_config` for every M: it is built by resolving the chain at every breakpoint of every tier. Where the
fallback depends on M (a cost model or a registered heuristic is active) the table says ``"auto"`` there, which
the op resolves through `select_config` (the same memoised answer).

Raises: ValueError for an unknown family/op or dtype from the caller; never on DB content or a failing plug-in
(a plug-in that raises or returns an id outside the lane's space is warned about once and skipped).
"""
from __future__ import annotations

import hashlib
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from .. import env as _env
from ..configs import SENTINELS, ConfigError, parse
from . import database as _db
from . import production as _production
from . import registry as _registry
from .arch import current_arch_family, normalize_arch
from .serving_rules import POLICY_NAMES, policy_answer, refusal

TIER_NAMES = ("autotune", "user", "system", "model", "default", "heuristic")

PluginFn = Callable[[Any, int, int, int, Any], "str | None"]


@dataclass(frozen=True)
class Selection:
    config: str
    tier: str
    signature: str


class _Cell:
    """A memoised selection (`serve_config`'s when `served`) and how many calls it answered."""

    __slots__ = ("sel", "calls", "family", "op", "served")

    def __init__(self, sel: Selection, family: str, op: str, served: bool = False) -> None:
        self.sel, self.calls, self.family, self.op, self.served = sel, 0, family, op, served


_LOCK = threading.Lock()
_MEMO: dict[tuple, _Cell] = {}
_CTX: dict[tuple, "_Ctx"] = {}
_TOTALS: dict[tuple[str, str, str, bool], list[int]] = {}  # (family, op, tier, served) -> [calls, shapes], past epochs
_FALLBACKS: dict[str, PluginFn] = {}
_COST_MODELS: dict[str, PluginFn] = {}
_WARNED: set[str] = set()


def _warn(msg: str) -> None:
    if msg in _WARNED:
        return
    _WARNED.add(msg)
    warnings.warn(msg, _db.TuningDBWarning, stacklevel=3)


def _on_reload(_epoch: int) -> None:
    global _MEMO, _CTX
    with _LOCK:
        for cell in _MEMO.values():
            t = _TOTALS.setdefault((cell.family, cell.op, cell.sel.tier, cell.served), [0, 0])
            t[0] += cell.calls
            t[1] += 1
        _MEMO, _CTX = {}, {}
        _WARNED.clear()


_db.on_reload(_on_reload)


# The runtime autotuner's tier (oasr_ops.tune.autotune installs it while an autotune() context is active):
# fn(family, op, dtype, n, k, m, arch) -> config id | None, asked ahead of the DB tiers on a memo miss only, so
# a memo hit costs the same with or without it.
_AUTOTUNE: Callable[[str, str, Any, int, int, int, str], "str | None"] | None = None


def set_autotune(fn: Callable[[str, str, Any, int, int, int, str], "str | None"] | None) -> None:
    """Install (None: remove) the autotune tier. The memo is dropped (no new epoch: the DB snapshot is the same)
    so every shape re-resolves with or without it; the caller drops the families' plan caches too."""
    global _AUTOTUNE
    _AUTOTUNE = fn
    _on_reload(_db.epoch())


def register_fallback(family: str, fn: PluginFn | None) -> None:
    """The family's untuned selector (e.g. the int8 heuristic): fn(lane, m, n, k, dtype) -> config id.

    Takes effect at the next `database.reload()`; None unregisters.
    """
    _check_family(family)
    if fn is None:
        _FALLBACKS.pop(family, None)
    else:
        _FALLBACKS[family] = fn


def register_cost_model(family: str, fn: PluginFn | None) -> None:
    """The cost-model tier for `family`: fn(lane, m, n, k, dtype) -> config id | None (None = no opinion).

    The model may consult `database.model_params(family, arch)`. Takes effect at the next reload.
    """
    _check_family(family)
    if fn is None:
        _COST_MODELS.pop(family, None)
    else:
        _COST_MODELS[family] = fn


def _check_family(family: str) -> None:
    _registry.get(family)  # ValueError naming the family when it is not registered


# ------------------------------------------------------------------------------------------------ context


@dataclass
class _Ctx:
    """Everything about one (family, op, dtype, n, k, arch) that does not depend on M, for one epoch."""

    family: str
    op: str
    dtype: Any
    n: int
    k: int
    arch: str
    sig: str
    lane: Any
    chain: list[tuple[str, tuple[tuple[int | None, str | None], ...], dict[str, str]]]
    model: PluginFn | None
    fallback_fn: PluginFn | None
    fallback_const: str | None  # the fallback when it does not depend on M
    fallback_tier: str


def _valid_plugin_id(cfg: Any, lane: Any) -> bool:
    if not isinstance(cfg, str):
        return False
    if cfg in SENTINELS:
        return True
    try:
        if lane is not None:
            lane.get(cfg)
        else:
            parse(cfg)
    except ConfigError:
        return False
    return True


def _feasible_regions(regions, lane, n: int, k: int, arch: str, sig: str):
    if lane is None:
        return regions
    out = []
    for m_hi, cfg in regions:
        if cfg is not None and cfg not in SENTINELS:
            try:
                why = lane.infeasible_reason(lane.get(cfg), n=n, k=k, arch_family=arch)
            except ConfigError as e:
                why = str(e)
            if why is not None:
                _warn(f"tuning DB {sig}: {cfg} cannot serve here ({why}); falls through")
                cfg = None
        out.append((m_hi, cfg))
    return tuple(out)


def _make_ctx(family: str, op: str, dtype: Any, n: int, k: int, arch: str, sig: str, eager: bool = False) -> _Ctx:
    spec = _registry.get(family)
    lane = spec.native_lane(arch)
    # OASR_GEMM_HEURISTIC=0: every shape of a lane-default family gets the lane default (DB and model ignored).
    heuristic_off = spec.policy == "default" and not _env.gemm_heuristic()
    model_on = _env.model_fallback()
    chain = []
    if not heuristic_off:
        for tier, e in _db.chain(family, op, dtype, n, k, arch):
            regions = e.regions_eager if eager and e.regions_eager is not None else e.regions
            chain.append((tier, _feasible_regions(regions, lane, n, k, arch, e.signature), dict(e.points)))
    model = None
    if model_on and not heuristic_off:
        model = _COST_MODELS.get(family) or (_model_tier(family, op, arch) if spec.modelled else None)
    # `spec.heuristic` is not a plug-in here: the chain answers the sentinel, which serving (or a plan) expands
    # for each M, so a baked region table keeps "heuristic" and agrees with `select_config`.
    fb = None if heuristic_off else _FALLBACKS.get(family)
    const = None
    if fb is None:
        const = lane.default.id if (lane is not None and spec.policy == "default") else spec.policy
    return _Ctx(family, op, dtype, n, k, arch, sig, lane, chain, model, fb, const, spec.fallback_tier)


def _model_tier(family: str, op: str, arch: str) -> PluginFn:
    """The built-in cost-model tier of a `modelled` family, as a plug-in bound to (family, op, arch)."""
    from . import model_tier

    def tier(lane: Any, m: int, n: int, k: int, dtype: Any) -> str | None:
        return model_tier.choose(family, op, lane, m, n, k, dtype, arch)

    tier.rungs = model_tier.RUNGS  # a step function of M: region_table bakes it (see there)
    return tier


def _context(family: str, op: str, dtype: Any, n: int, k: int, arch: str, eager: bool = False) -> _Ctx:
    dt = _db.normalize_dtype(dtype)
    key = (_db.epoch(), family, op, dt, n, k, arch, eager)  # the epoch: an older snapshot's context never leaks
    ctx = _CTX.get(key)
    if ctx is None:
        sigs = _db.lookup_signatures(family, op, dt, n, k)
        sig = sigs[0] if sigs else f"{family}|op={op}|dt={dt}|N={n}|K={k}"
        ctx = _make_ctx(family, op, dt, n, k, arch, sig, eager)
        _CTX[key] = ctx
    return ctx


def _walk_db(ctx: _Ctx, m: float, point: str | None = None) -> tuple[str, str] | None:
    for tier, regions, points in ctx.chain:
        if point is not None and point in points:
            return points[point], tier
        for m_hi, cfg in regions:
            if m_hi is None or m_hi >= m:
                if cfg is not None:
                    return cfg, tier
                break  # a hole: this entry does not answer here
    return None


def _call_plugin(kind: str, fn: PluginFn, ctx: _Ctx, m: int) -> str | None:
    try:
        cfg = fn(ctx.lane, m, ctx.n, ctx.k, ctx.dtype)
    except Exception as e:  # a broken plug-in must not break a GEMM call
        _warn(f"{kind} for {ctx.family} raised {e!r}; skipped")
        return None
    if cfg is None:
        return None
    if not _valid_plugin_id(cfg, ctx.lane):
        _warn(f"{kind} for {ctx.family} returned {str(cfg)[:64]!r}, not a config of this lane; skipped")
        return None
    return cfg


def _fallback(ctx: _Ctx, m: int) -> tuple[str, str]:
    if ctx.model is not None:
        cfg = _call_plugin("cost model", ctx.model, ctx, m)
        if cfg is not None:
            return cfg, "model"
    if ctx.fallback_fn is not None:
        cfg = _call_plugin("fallback", ctx.fallback_fn, ctx, m)
        if cfg is not None:
            return cfg, ctx.fallback_tier
        return _registry.get(ctx.family).policy, ctx.fallback_tier
    return ctx.fallback_const or _registry.get(ctx.family).policy, ctx.fallback_tier


def _resolve(family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None,
             point: str | None = None) -> Selection:
    if not _db._known(family, op):
        raise ValueError(f"unknown family/op {family!r}/{op!r}")
    a = normalize_arch(arch) if arch else current_arch_family()
    if a is None:
        dt = _db.normalize_dtype(dtype)
        sigs = _db.lookup_signatures(family, op, dt, n, k)
        return Selection(_registry.get(family).no_arch, "default",
                         sigs[0] if sigs else f"{family}|op={op}|N={n}|K={k}")
    ctx = _context(family, op, dtype, n, k, a)
    if _AUTOTUNE is not None and point is None:
        cfg = _AUTOTUNE(family, op, dtype, n, k, m, a)
        if cfg is not None:
            return Selection(cfg, "autotune", ctx.sig)
    hit = _walk_db(ctx, m, point)
    cfg, tier = hit if hit is not None else _fallback(ctx, m)
    return Selection(cfg, tier, ctx.sig)


def _miss(key: tuple, family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None,
          point: str | None = None, served: bool = False) -> _Cell:
    e0 = _db.epoch()
    sel = _serve(family, op, dtype, n, k, m, arch) if served else _resolve(family, op, dtype, n, k, m, arch, point)
    cell = _Cell(sel, family, op, served)
    with _LOCK:
        # A reload between resolving and memoising: serve this call, memoise nothing from the old epoch.
        if _db.epoch() == e0:
            cell = _MEMO.setdefault(key, cell)
    return cell


# ------------------------------------------------------------------------------------------------ serving


def _serve(family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None) -> Selection:
    if not _db._known(family, op):
        raise ValueError(f"unknown family/op {family!r}/{op!r}")
    spec = _registry.get(family)
    a = normalize_arch(arch) if arch else current_arch_family()
    lane = spec.native_lane(a) if a is not None else None
    if lane is None:  # no GPU family known, or no lane of the family runs there: only torch can serve
        dt = _db.normalize_dtype(dtype)
        sigs = _db.lookup_signatures(family, op, dt, n, k)
        return Selection("torch", "default", sigs[0] if sigs else f"{family}|op={op}|dt={dt}|N={n}|K={k}")
    raw = _resolve(family, op, dtype, n, k, m, a)  # the tier chain (not memoised twice: this answer is)
    cfg, tier, sig = raw.config, raw.tier, raw.signature
    if cfg == "heuristic" and spec.heuristic is not None:  # fallback or a measured region: keeps its tier
        return Selection(spec.heuristic(lane, m, n, k, a), tier, sig)
    if cfg in SENTINELS and cfg != "default":  # torch, fused (no fused epilogue is served), heuristic without one
        return Selection("torch", tier, sig)
    if cfg == "default":
        cfg = lane.default.id
    why = refusal(spec, lane, op, cfg, tier, a)
    if why is None:
        return Selection(cfg, tier, sig)
    _warn(f"oasr.{op}: {sig}: {why}; skipped ({POLICY_NAMES[spec.policy]} answers)")
    return Selection(policy_answer(spec, lane, m, n, k, a), spec.fallback_tier, sig)


# ------------------------------------------------------------------------------------------------ public


def select_config(family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The config for one GEMM-family call (see the module docstring)."""
    # The hit path: no closures here (a lambda would turn every argument into a cell variable, +100 ns).
    key = (family, op, dtype, n, k, m, arch)
    cell = _MEMO.get(key)
    if cell is None:
        cell = _miss(key, family, op, dtype, n, k, m, arch)
    cell.calls += 1
    return cell.sel


def serve_config(family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The config a launcher runs for one call: `select_config` through the family's serving rules (module
    docstring); a concrete id of the native lane or ``"torch"``."""
    key = (family, op, dtype, n, k, m, arch, True)
    cell = _MEMO.get(key)
    if cell is None:
        cell = _miss(key, family, op, dtype, n, k, m, arch, served=True)
    cell.calls += 1
    return cell.sel


def select_conv1d(op: str, dtype: Any, n: int, k: int, batch: int, t: int, t_out: int | None = None,
                  arch: str | None = None) -> Selection:
    """Conv1D: an exact measured point ``"BxT"`` first, then regions over M = B * T_out (T_out defaults to T)."""
    key = ("conv1d", op, dtype, n, k, batch, t, t_out, arch)
    cell = _MEMO.get(key)
    if cell is None:
        m = batch * (t_out if t_out is not None else t)
        cell = _miss(key, "conv1d", op, dtype, n, k, m, arch, f"{batch}x{t}")
    cell.calls += 1
    return cell.sel


def region_table(family: str, op: str, dtype: Any, n: int, k: int, arch: str | None = None,
                 eager: bool = False) -> list[list]:
    """All tiers merged into ``[[m_hi, config], ..., [None, terminator]]``; agrees with `select_config` (with
    ``eager``, the entries' ``regions_eager``: with `eager_answer`)."""
    if not _db._known(family, op):
        raise ValueError(f"unknown family/op {family!r}/{op!r}")
    a = normalize_arch(arch) if arch else current_arch_family()
    if a is None:
        return [[None, _registry.get(family).no_arch]]
    ctx = _context(family, op, dtype, n, k, a, eager)
    bps = sorted({m for _, regions, _ in ctx.chain for m, _ in regions if m is not None})
    # The built-in model tier answers a step function of M (its rungs): bake it too, so a symbolic-M site whose
    # every answer is cuBLAS stays an aten node. Any other M-dependent fallback is resolved per call ("auto").
    rungs = getattr(ctx.model, "rungs", None) if ctx.fallback_fn is None else None
    if rungs is not None:
        bps = sorted(set(bps) | set(rungs))
    beyond = ctx.fallback_const if (ctx.model is None and ctx.fallback_fn is None) else "auto"
    table: list[list] = []
    for b in bps + [None]:
        hit = _walk_db(ctx, float("inf") if b is None else b)
        if hit is not None:
            cfg = hit[0]
        elif rungs is not None:
            cfg = _fallback(ctx, rungs[-1] if b is None else b)[0]
        else:
            cfg = beyond
        if table and table[-1][1] == cfg:
            table[-1][0] = b  # same answer as the interval below: widen it
        else:
            table.append([b, cfg])
    return table


def table_tier(family: str, op: str, dtype: Any, n: int, k: int, arch: str | None = None) -> str:
    """The tier a baked region table is reported under: the highest DB tier with an entry for the signature, else
    the cost model where one answers the family (the tier `select_config` names for such an M), else the family's
    fallback tier."""
    a = normalize_arch(arch) if arch else current_arch_family()
    if a is None:
        return _registry.get(family).fallback_tier
    ctx = _context(family, op, dtype, n, k, a)
    if ctx.chain:
        return ctx.chain[0][0]
    return "model" if ctx.model is not None else ctx.fallback_tier


def eager_answer(family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None = None
                 ) -> tuple[str, str] | None:
    """(config, tier) the DB answers a graph run without CUDA graphs at a static M (the entries' ``regions_eager``
    where they have one, else their regions); None where no DB tier covers M. Compile time only: not memoised."""
    if not _db._known(family, op):
        raise ValueError(f"unknown family/op {family!r}/{op!r}")
    a = normalize_arch(arch) if arch else current_arch_family()
    if a is None:
        return None
    return _walk_db(_context(family, op, dtype, n, k, a, eager=True), m)


def resolve_in_table(table: list[list], m: int) -> str:
    """Round M up to the first row with ``m_hi >= M`` (None = catch-all); "auto" if the table ends early."""
    for m_hi, cfg in table:
        if m_hi is None or m_hi >= m:
            return cfg
    return "auto"


def reset_selection(family: str | None = None) -> None:
    """Forget the memoised selections, contexts and counts of `family` (all with None), the production sets and
    the warnings (tests; a reload drops the memo but keeps the counts)."""
    global _MEMO, _CTX
    with _LOCK:
        _MEMO = {key: c for key, c in _MEMO.items() if family is not None and c.family != family}
        _CTX = {key: c for key, c in _CTX.items() if family is not None and c.family != family}
        for key in [key for key in _TOTALS if family is None or key[0] == family]:
            del _TOTALS[key]
        _WARNED.clear()
    _production.reset()


def selection_hash(arch: str | None = None) -> str:
    """`database.snapshot_hash` plus the settings and plug-ins that change selections (for a pass uuid)."""
    h = hashlib.sha256(_db.snapshot_hash(arch).encode())
    for var in _env.SELECTION_VARS:
        h.update(f"|{var}={os.environ.get(var, '')}".encode())
    for name, reg in (("model", _COST_MODELS), ("fallback", _FALLBACKS)):
        for fam, fn in sorted(reg.items()):
            h.update(f"|{name}:{fam}={getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}".encode())
    return h.hexdigest()
