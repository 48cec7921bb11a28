"""`oasr_ops.autotune()`: runtime tuning of eager calls, for shapes nothing covers (spec, "oasr.autotune()").

    with oasr_ops.autotune(cache="oasr_tune.json"):
        y = oasr_ops.gemm(a, w)     # first call of this shape's bucket: profiles every candidate, then serves it

    with oasr_ops.autotune(False, cache="oasr_tune.json"):   # serve the cache, never profile (a miss: the DB)
        ...

How it reaches the ops: an op resolves ``config="auto"`` through `runtime.select.select_config`. While a context
is active, `runtime.select.set_autotune` installs this module's tier, asked ahead of the DB tiers on a memo miss
(the runtime never imports this module). Entering and leaving drop the selection memo and every family's plan
cache (no new DB epoch), so each shape re-resolves once: inside with the autotune tier, after the exit from the
DB again. A tuned shape inside the context costs what it costs outside (one plan-cache lookup per call).

Which families: those whose registry spec has a candidate factory and operands (`tune.candidates`) — gemm
(gemm, gemm_activation), bmm, scaled_mm — unless the spec sets ``handlers["autotune"] = False``.

Profiling (`BenchMeasurer`, the real measurer; tests inject a fake one): every statically feasible candidate of
the signature (torch/cuBLAS and the heuristic pseudo-arm included; ``space="compiled"``: only what prewarm
times, the lane default and coverage basis, which needs no JIT build), numerically gated, timed under the bench protocol (`tune.bench.measure`: CUDA graphs
of N >= 8 calls, separator subtracted, shuffled rounds, median; weights cold by default). A candidate whose call
cannot be graph-captured is timed eagerly. The objective is GPU time + ``eager_fraction`` x the candidate's host
issue cost (default 1: the context serves eager calls). The winner is kept at the exact M it was measured at
(`tune.autotune_cache`: buckets, closest measured M at or above the call, the cache file and its versions).

On exit: new results are flushed to ``cache`` (locked, atomic), and with ``publish=True`` the winners of this
context are published into the user tier at their measured M (regions without a catch-all, merged point-wise).
The running process keeps its DB snapshot: compiled graphs and the production path serve them after
``oasr_ops.reload_tuning()`` (said once; never done silently, a reload drops compiled graphs).

Refusals and no-ops: profiling inside a CUDA-graph capture raises `AutotuneError` (a shape already tuned is
served); entered inside torch.compile'd code the context changes nothing (compiled graphs bake their
selections; one warning); on a machine without a GPU it changes nothing (one warning).
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..runtime import database as _db
from ..runtime import registry
from ..runtime import select as _select
from ..runtime.arch import current_arch_family
from .autotune_cache import AutotuneWarning, Result, ResultCache
from .candidates import Candidate, candidates_for, parts_of
from .points import Point

__all__ = ["autotune", "Autotune", "AutotuneError", "AutotuneWarning", "BenchMeasurer", "autotune_families"]

# fn(point, candidates) -> {candidate id: objective seconds} for the candidates that ran (gate passed).
Measurer = Callable[[Point, Sequence[Candidate]], "dict[str, float]"]

SPACES = ("all", "compiled")
_WARNED: set[str] = set()


class AutotuneError(RuntimeError):
    pass


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, AutotuneWarning, stacklevel=3)


def autotune_families() -> list[str]:
    """Families that opt in: a candidate factory and operands, and no ``handlers["autotune"] = False``."""
    out = []
    for name, spec in registry.families().items():
        flag = spec.handlers.get("autotune")
        if flag is False:
            continue
        if flag or (spec.handler("candidates") is not None and spec.handler("operands") is not None):
            out.append(name)
    return out


def _capturing() -> bool:
    import torch

    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # no CUDA runtime: nothing can be capturing
        return False


def _compiling() -> bool:
    import torch

    try:
        return bool(torch.compiler.is_compiling())
    except Exception:  # pragma: no cover
        return False


def _reset_plans() -> None:
    for spec in registry.families().values():  # every family's plan cache (keyed by "auto", not by the tier)
        reset = spec.handler("reset_plans")
        if reset is not None:
            reset()


# ------------------------------------------------------------------------------------------------ measuring


@dataclass
class BenchMeasurer:
    """The real measurer: gate, then time every candidate at one point under the bench protocol (GPU only).

    cold:           rotate weight copies to exceed 2x L2 (an encoder's weights do not fit in L2).
    rounds:         shuffled interleaved rounds (the median of them is the estimate).
    eager_fraction: alpha of the objective GPU time + alpha x host issue time.
    max_copies:     cap on the weight rotation (and on the calls per replay).
    """

    device: str = "cuda"
    cold: bool = True
    rounds: int = 7
    eager_fraction: float = 1.0
    max_copies: int = 512
    _host: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    _capturable: dict[tuple[str, str], bool] = field(default_factory=dict)

    def host_us(self, family: str, arch: str) -> dict[str, float]:
        from .candidates import host_costs

        key = (family, arch)
        if key not in self._host:
            try:
                self._host[key] = host_costs(family, arch, self.device)
            except Exception as e:  # the objective falls back to GPU time alone
                _warn_once(f"host:{family}", f"oasr.autotune: host issue cost of {family} not measured ({e!r}); "
                           "ranking by GPU time")
                self._host[key] = {}
        return self._host[key]

    def capturable(self, key: tuple[str, str], call: Callable[[], Any]) -> bool:
        """Whether one call can be captured into a CUDA graph (cached per signature and candidate)."""
        import torch

        if key not in self._capturable:
            ok = True
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(s):
                    call()  # warm: plans, lazy loading, workspaces happen outside the capture
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=s):
                        call()
                del g
            except Exception:
                ok = False
            finally:
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
            self._capturable[key] = ok
        return self._capturable[key]

    def __call__(self, point: Point, cands: Sequence[Candidate]) -> dict[str, float]:
        from . import bench
        from .candidates import gate_candidates, operands_for

        bench.refuse_in_capture()
        ops = operands_for(point, self.device, seed=point.m)
        copies = bench.copies_for(ops.weight_bytes(), self.cold, cap=self.max_copies)
        if copies > 1:
            ops = operands_for(point, self.device, seed=point.m, copies=copies)
        # the process's own output dtype only (variants=False): a variant would JIT-build kernels it never runs
        passed, _rejected = gate_candidates(list(cands), ops, catch=True, variants=False)
        if not passed:
            return {}
        n = max(bench.MIN_CALLS, copies)
        arms = {c.id: [c.make_call(ops, j) for j in range(n)] for c in passed}
        eager = frozenset(c.id for c in passed if not self.capturable((point.signature, c.id), arms[c.id][0]))
        res = bench.measure(arms, rounds=self.rounds, eager=eager)
        host = self.host_us(point.family, current_arch_family() or "") if self.eager_fraction else {}
        by_id = {c.id: c for c in passed}
        return {cid: r.estimate.median_s + self.eager_fraction * host.get(by_id[cid].host or "", 0.0) * 1e-6
                for cid, r in res.items()}


# ------------------------------------------------------------------------------------------------ context


@dataclass
class Stats:
    profiles: int = 0          # shapes profiled (one per bucket miss)
    timed: int = 0             # candidate timings over all profiles
    tuning_s: float = 0.0      # wall time spent profiling
    hits: int = 0              # resolutions answered from the results
    misses: int = 0            # resolutions the results could not answer
    flushed: int = 0
    published: list[str] = field(default_factory=list)


class Autotune:
    """The context manager `autotune()` returns (also usable as a decorator-free object: enter/exit)."""

    def __init__(self, tune: bool = True, cache: str | os.PathLike | None = None, *, publish: bool = True,
                 space: str = "all", measure: Measurer | None = None) -> None:
        if space not in SPACES:
            raise ValueError(f"oasr.autotune: space must be one of {SPACES}, got {space!r}")
        for name, value in (("tune", tune), ("publish", publish)):
            if not isinstance(value, bool):  # a string such as "no" would otherwise read as True
                raise ValueError(f"oasr.autotune: {name} must be True or False, got {value!r}")
        if cache is not None and os.path.isdir(cache):  # found up front, not when __exit__ writes it (results lost)
            raise ValueError(f"oasr.autotune: cache {os.fspath(cache)!r} is a directory; pass a JSON file path "
                             f"(e.g. {os.path.join(os.fspath(cache), 'autotune.json')!r})")
        self.tune, self.cache_path, self.publish, self.space = tune, cache, publish, space
        self._measure = measure
        self.stats = Stats()
        self.active = False
        self.arch: str | None = None
        self.cache: ResultCache | None = None
        self._families: frozenset[str] = frozenset()
        self._winners: dict[tuple[str, str, str, int, int], dict[int, Result]] = {}
        self._lock = threading.RLock()
        self._prev: Any = None

    # -- the select tier --------------------------------------------------------------------------

    def __call__(self, family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str) -> str | None:
        if family not in self._families or arch != self.arch or self.cache is None:
            return None
        dt = _db.normalize_dtype(dtype)
        sig = _db.signature(family, op, dt, n, k)
        r = self.cache.lookup(sig, m)
        if r is not None:
            self.stats.hits += 1
            return r.config
        if not self.tune:
            self.stats.misses += 1
            return None
        if _capturing():
            raise AutotuneError(f"oasr.autotune: {sig} M={m} has no result and cannot be profiled inside a "
                                "CUDA-graph capture; run it eagerly once under autotune() first, or capture "
                                "outside the context")
        with self._lock:
            r = self.cache.lookup(sig, m)  # another thread may have profiled it meanwhile
            if r is None:
                r = self._profile(family, op, dt, n, k, m, arch, sig)
        if r is None:
            self.stats.misses += 1
            return None
        return r.config

    def _profile(self, family: str, op: str, dt: str, n: int, k: int, m: int, arch: str, sig: str
                 ) -> Result | None:
        parts = parts_of(sig)
        point = Point(m, signature=sig, family=family, op=op, dtype=parts.dt or dt, n=n, k=k)
        cands = [c for c in candidates_for(parts, arch)
                 if c.feasible(point) is None and (self.space == "all" or c.prewarm)]
        if not cands:
            return None
        t0 = time.monotonic()
        try:
            times = self._measure(point, cands) if self._measure is not None else {}
        except Exception as e:  # a failed profile must not break the user's call: the fallback serves it
            _warn_once(f"profile:{sig}:{m}", f"oasr.autotune: profiling {sig} M={m} failed ({e!r}); "
                       "the tuning DB serves it")
            return None
        finally:
            self.stats.tuning_s += time.monotonic() - t0
        times = {cid: t for cid, t in times.items() if t == t and t >= 0}  # drop NaN / negative
        self.stats.profiles += 1
        self.stats.timed += len(times)
        if not times:
            return None
        best = min(times, key=times.__getitem__)
        r = Result(m, best, times[best] * 1e6, len(times))
        self.cache.add(sig, r)  # type: ignore[union-attr]
        self._winners.setdefault((family, op, dt, n, k), {})[m] = r
        return r

    # -- enter / exit -----------------------------------------------------------------------------

    def __enter__(self) -> "Autotune":
        if _compiling():
            _warn_once("compile", "oasr.autotune: inside torch.compile'd code the context changes nothing "
                       "(compiled graphs bake their selections); use it around eager calls")
            return self
        import torch

        if self._measure is None:
            if not torch.cuda.is_available():
                _warn_once("cpu", "oasr.autotune: no GPU here; the context changes nothing on a CPU")
                return self
            self._measure = BenchMeasurer()
        self.arch = current_arch_family()
        if self.arch is None:
            _warn_once("arch", "oasr.autotune: no arch family known (no GPU, no OASR_ARCH); the context "
                       "changes nothing")
            return self
        self._families = frozenset(autotune_families())
        self.cache = ResultCache(self.arch)
        if self.cache_path is not None:
            self.cache.load(self.cache_path)
        self._prev = _select._AUTOTUNE
        _select.set_autotune(self)
        _reset_plans()
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.active:
            return
        self.active = False
        _select.set_autotune(self._prev)
        _reset_plans()
        self.flush()

    def flush(self) -> None:
        """Write new results to the cache file and (publish=True) the new winners into the user tier."""
        if self.cache is not None and self.cache_path is not None:
            try:
                self.stats.flushed += self.cache.flush(self.cache_path)
            except (OSError, RuntimeError, TimeoutError) as e:  # unwritable path, busy lock, unmovable bad file
                _warn_once(f"flush:{self.cache_path}:{e}", f"oasr.autotune: results not saved to {self.cache_path} "
                           f"({e}); this process keeps serving them")
        if self.publish and self._winners:
            self._publish()

    def _publish(self) -> None:
        from . import database

        entries: dict[str, dict[str, dict]] = {}
        for (family, op, dt, n, k), pts in self._winners.items():
            sig = _db.signature(family, op, dt, n, k)  # dt-specific: measured in that dtype only
            entries.setdefault(family, {})[sig] = {
                "regions": [[m, r.config] for m, r in sorted(pts.items())],
                "source": "autotune",
                "notes": [f"M={m}: {r.config} {r.us:.2f} us of {r.candidates} candidates (autotune)"
                          for m, r in sorted(pts.items())]}
        paths: list[str] = []
        for family, ents in entries.items():
            try:
                paths.append(str(database.publish(family, ents, tier="user", arch=self.arch, merge_regions=True)))
            except (OSError, RuntimeError, ValueError, TimeoutError) as e:
                _warn_once(f"publish:{family}:{e}", f"oasr.autotune: {family} winners not published ({e})")
        self._winners.clear()
        self.stats.published += paths
        if paths:
            _warn_once("reload", "oasr.autotune: winners published to the user tier ("
                       + ", ".join(paths) + "); this process keeps its DB snapshot, so compiled graphs and "
                       "calls outside autotune() serve them after oasr_ops.reload_tuning() (which also drops "
                       "compiled graphs; nothing changes silently)")


def autotune(tune: bool = True, cache: str | os.PathLike | None = None, *, publish: bool = True,
             space: str = "all", measure: Measurer | None = None) -> Autotune:
    """Runtime tuning for eager calls (see the module docstring).

    tune:    True: a bucket miss profiles every candidate at the call's shape; False: serve the results only
             (a miss takes the tuning DB's answer).
    cache:   a JSON file of results to load on entry and flush to on exit (None: this context only).
    publish: also write this context's winners into the user tier at their measured M (served after
             `oasr_ops.reload_tuning()`).
    space:   ``all`` candidates of the family (a config not yet compiled is JIT-built) or ``compiled`` (what
             prewarm times: the lane default and coverage basis, torch / the heuristic; no JIT build).
    measure: the measurer (default `BenchMeasurer()`); tests inject a fake one.
    """
    return Autotune(tune, cache, publish=publish, space=space, measure=measure)
