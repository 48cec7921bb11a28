"""The backend's graph pass: `OasrRewritePass` (Inductor's ``post_grad_custom_pre_pass``, one `CustomGraphPass`
object, torch 2.11-compatible) runs `oasr_ops.families.graph.rewrite_graph`, which hands the post-grad graph to
every registered family's matcher (``families/<name>/rewrite.py``) with configs baked in. Nothing here names a
family.

The rewrite log (`rewrite_log()`): every graph this process's pass rewrote. On an FX/AOT cache hit the pass does
not run, so the backend records the cached graph instead (`record_cache_hit`), and `cache_hit_log()` re-derives
what that graph bakes — the same rewrite on the graph Inductor's own pipeline gives the pass for the Dynamo graph
at its example shapes (symbolic sizes at their hints; fake tensors, caches off, stopped at the pass: `_replay`),
with the same DB and sources, which is what the cache key (`uuid`) guarantees. It is derived lazily, when a report
asks, so a cache hit costs no trace. Everything a compiled graph needs is in the graph itself.
"""
from __future__ import annotations

import hashlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..families.graph import GemmSite, RewriteResult, rewrite_graph  # noqa: F401  (GemmSite: re-exported)

_LOG: list[RewriteResult] = []
_LOG_LOCK = threading.Lock()
_LOCAL = threading.local()  # per compiling thread: how many times our pass ran (the backend's cache-hit test)

_MAX_PENDING = 64  # cache-hit graphs held for re-derivation (each holds its Dynamo graph module)


@dataclass
class _CacheHit:
    gm: Any                  # the Dynamo graph module (dropped once derived)
    args: list[Any]          # (shape, dtype, device, requires_grad) per tensor input, plain values otherwise
    arch: str | None
    epoch: int
    eager: bool = False      # compiled to run without CUDA graphs (bakes the DB's eager regions)
    grad: bool = False       # compiled with grad mode on (a joint graph: the replay rewrites its forward)
    result: RewriteResult | None = None


_HITS: list[_CacheHit] = []
_DROPPED = [0]  # cache hits not kept (over _MAX_PENDING)


def rewrite_log() -> list[RewriteResult]:
    """Every graph the backend's pass rewrote in this process (oldest first)."""
    with _LOG_LOCK:
        return list(_LOG)


def clear_rewrite_log() -> None:
    """Forget the rewrite log and the recorded cache hits."""
    with _LOG_LOCK:
        _LOG.clear()
        _HITS.clear()
        _DROPPED[0] = 0


def pass_runs() -> int:
    """How many times the pass ran in this thread (the backend compares it around `compile_fx`)."""
    return getattr(_LOCAL, "runs", 0)


def record_cache_hit(gm: Any, example_inputs: list[Any], arch: str | None = None, eager: bool = False) -> None:
    """The backend compiled `gm` without running the pass (an FX/AOT cache hit): keep what re-deriving its sites
    needs — the graph module and its inputs' shapes (not the tensors: no weights are held)."""
    from ..runtime import database
    from ..tune.census import describe_inputs

    args = describe_inputs(example_inputs)
    with _LOG_LOCK:
        pending = [h for h in _HITS if h.result is None]
        if len(pending) >= _MAX_PENDING:
            _DROPPED[0] += 1
            return
        _HITS.append(_CacheHit(gm, args, arch, database.epoch(), eager, torch.is_grad_enabled()))


class _Replayed(Exception):
    """Raised by the replay's pass once it has rewritten the graph: nothing after it needs to run."""


def _replay(hit: _CacheHit) -> RewriteResult:
    """Run Inductor's own pipeline (AOTAutograd, joint-graph passes, partition) on the cached Dynamo graph at its
    example shapes, on fake tensors and with the caches off, up to where the backend's pass runs; that pass
    rewrites the graph (configs baked, the hit's arch and eager mode) and stops the compile: the graph the pass saw,
    joint-graph passes included. The inputs keep their requires_grad: matmul folds a transposed 3-D input into an
    mm (a GEMM site) only when the weight requires grad, as parameters do; without it a conformer's pointwise
    Linear came out as a bmm the pass never saw, and every cache hit's report lost that site."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from ..tune.census import meta_stand_in

    got: list[RewriteResult] = []

    def replayed(graph: torch.fx.Graph) -> None:
        got.append(rewrite_graph(graph, bake=True, arch=hit.arch, eager=hit.eager))
        raise _Replayed

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    args = []
    for a in hit.args:
        if isinstance(a, tuple):
            meta, device = meta_stand_in(a)
            a = mode.from_tensor(meta, static_shapes=True)
            a.fake_device = device
        args.append(a)
    try:
        # freezing off: it would constant-fold the fake parameters; the sites are the same with it (the rewrite
        # takes a frozen weight like a parameter)
        with inductor_config.patch(post_grad_custom_pre_pass=replayed, fx_graph_cache=False, freezing=False), \
                functorch_config.patch(enable_autograd_cache=False), torch.set_grad_enabled(hit.grad):
            compile_fx(hit.gm, args)
    except Exception as e:  # the pass raises _Replayed (possibly wrapped by Inductor); anything else is a failure
        if not got:
            raise RuntimeError(f"{type(e).__name__}: {e}") from None
    if not got:
        raise RuntimeError("the compile finished without running the pass")
    return got[0]


def _derive(hit: _CacheHit) -> RewriteResult:
    try:
        res = _replay(hit)
    except Exception as e:  # a graph the replay cannot compile: say so rather than report nothing
        res = RewriteResult(skipped=[("<graph>", f"not re-derived from the cache hit: {e}")])
    res.epoch, res.source = hit.epoch, "cache"
    return res


def cache_hit_log() -> list[RewriteResult]:
    """What each graph compiled from an FX/AOT cache hit in the current DB epoch bakes (re-derived on first ask;
    see the module docstring). Hits of an older epoch are dropped: `reload_tuning` recompiles those graphs."""
    from ..runtime import database

    ep = database.epoch()
    with _LOG_LOCK:
        _HITS[:] = [h for h in _HITS if h.epoch == ep]
        todo = [h for h in _HITS if h.result is None]
    for h in todo:
        h.result = _derive(h)
        h.gm = None  # the record no longer needs the graph
    with _LOG_LOCK:
        return [h.result for h in _HITS if h.result is not None]


def cache_hits_dropped() -> int:
    return _DROPPED[0]


# ------------------------------------------------------------------------------------------------ the pass

def _family_sources() -> list[Path]:
    """Every module that decides what the pass bakes: each family's package (its matcher, ops, selection policy,
    lanes — the files next to its ``rewrite`` handler), the generic rewrite, selection, and this module."""
    from ..families import graph, quant_patterns
    from ..runtime import plans, registry, select

    paths = [Path(__file__), Path(graph.__file__), Path(select.__file__), Path(plans.__file__),
             Path(__file__).with_name("quantize_pass.py"), Path(__file__).with_name("fuse_quant.py"),
             Path(quant_patterns.__file__), Path(__file__).with_name("fuse_residual.py"),
             Path(__file__).with_name("fuse_siblings.py")]
    for spec in registry.families().values():
        matcher = spec.handler("rewrite")
        if matcher is None:
            continue
        module = sys.modules.get(getattr(matcher, "__module__", ""))
        if module is None or not getattr(module, "__file__", None):
            continue
        paths.extend(sorted(Path(module.__file__).parent.glob("*.py")))
    return paths


def _source_hash() -> str:
    h = hashlib.sha256()
    for p in _family_sources():
        h.update(str(p.name).encode())
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(str(p).encode())
    return h.hexdigest()


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _Base
except ImportError:  # pragma: no cover - torch < 2.6
    _Base = object  # type: ignore[misc,assignment]


def _fold_weight_transforms(graph: torch.fx.Graph) -> None:
    """Under Inductor's freezing, fold what the rewrite computes from constants alone — a conv weight in KRSC, the
    frontend Linear's column-permuted weight, a depthwise conv's fp32 BatchNorm scale and shift, the [N, K] view of
    a folded weight transpose — into constants, once. Freezing's own constant folding runs before the post-grad
    passes, so without this every such node would run on every call (the model's parameters are constants only
    under freezing; otherwise they are graph inputs and there is nothing to fold). The same folding function
    freezing uses, on the same graph module."""
    import torch._inductor.config as inductor_config

    gm = graph.owning_module
    if not inductor_config.freezing or gm is None or not any(n.op == "get_attr" for n in graph.nodes):
        return
    try:
        from torch._inductor.constant_folding import constant_fold
    except ImportError:  # pragma: no cover - a torch without it: the nodes run per call, the results are the same
        return
    constant_fold(gm)


class OasrRewritePass(_Base):  # type: ignore[misc]
    """The `post_grad_custom_pre_pass` object. `uuid()` = pass sources + version + arch + DB selection hash +
    whether the graph runs without CUDA graphs (``eager``: it bakes the DB's eager regions, `families.graph.bake`)."""

    def __init__(self, arch: str | None = None, eager: bool = False) -> None:
        self.arch = arch
        self.eager = eager

    def __call__(self, graph: torch.fx.Graph) -> None:
        _LOCAL.runs = pass_runs() + 1
        res = rewrite_graph(graph, bake=True, arch=self.arch, eager=self.eager)
        _fold_weight_transforms(graph)
        with _LOG_LOCK:
            _LOG.append(res)

    def uuid(self) -> str:
        from .._version import __version__
        from ..runtime import select
        from ..runtime.arch import current_arch_family, normalize_arch

        arch = normalize_arch(self.arch) if self.arch else current_arch_family()
        h = hashlib.sha256()
        for part in ("oasr-rewrite-v1", _source_hash(), __version__, arch or "none", select.selection_hash(arch),
                     "eager" if self.eager else "graphs"):
            h.update(part.encode())
            h.update(b"|")
        return h.hexdigest()


class ChainedPass(_Base):  # type: ignore[misc]
    """Ours, then a user's pass from the options (torch 2.11 takes one object per slot)."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.first(graph)
        self.second(graph)

    def uuid(self) -> Any:
        u1, u2 = self.first.uuid(), getattr(self.second, "uuid", lambda: None)()
        if not u1 or not u2:
            return None  # a falsy uuid bypasses the caches, as the user's pass asked
        return hashlib.sha256(f"{u1}|{u2}".encode()).hexdigest()
