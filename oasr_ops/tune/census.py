"""`oasr tune census`: which GEMM shapes a deployment runs, weighted by traffic — traced, no GPU needed.

Graph keys (what a deployment captures one graph for, spec "The census"):

* offline: (batch bucket, time bucket). Batch buckets are the powers of two up to ``--max-batch-size`` (plus
  the maximum itself); time buckets are multiples of ``--time-granularity`` input frames (default 64) up to the
  longest utterance of the manifest (or ``--max-seconds``). A fixed-window frontend (``census_info
  ["fixed_window"]``, Whisper's 3000 frames) has exactly one time key, its window, never rounded to the
  granularity (the encoder rejects 3008). Traffic: the manifest's durations (JSON lines with ``duration`` in
  seconds) are replayed through length-sorted batching — longest first, ``--max-batch-size`` utterances per
  batch, padded to the batch's longest — and each batch counts once for its (batch bucket, time bucket).
* streaming: cohort widths 1..``--max-batch-size`` x one chunk of ``--chunk-size`` encoder frames, i.e.
  ``chunk * subsampling + (subsampling - 1)`` input frames (the smallest input giving ``chunk`` outputs through
  a stack of stride-2 k=3 convs) unless ``--chunk-frames`` says otherwise. Traffic: a concurrency histogram.
  Default (decision): a Poisson distribution of active streams with mean ``max_batch_size / 4``, truncated to
  1..max and renormalised — a service provisioned for 4x its mean load, most steps at a few streams, a thin
  tail up to the cap. ``--concurrency-mean`` moves the mean; ``--concurrency FILE`` ({"width": weight} JSON)
  replaces the histogram. ``--steps`` (default 1000) scales it to call counts.

Every key is captured by the deployment, so every point a key reaches is must-tune, whether or not the
replayed traffic used it (its weight is then 0).

Tracing (why it is fast): the model is traced with `make_fx` on FakeTensors (no real compute, weights built on
the ``meta`` device when the builder accepts ``device``), with Inductor's decomposition table, and the graph is
run through the backend's own rewrite (`oasr_ops.families.graph.rewrite_graph`, ``bake=False``), so the census
sees exactly the sites the backend rewrites. Each site becomes census points through its family's ``census``
handler (default: one point per site; a family that is not censused yet gives none, counted under
``not_censused``). Batch and time are *symbolic* in the trace: one trace gives every
site's M as an expression of (B, T), and each key is a substitution — all 16 layers sharing a signature cost
nothing extra. A trace records the shape guards the model took; a key that violates them (B=1 specialises,
a time length under the subsampling's minimum) gets a trace of its own, so results are exact per key.
``--max-keys`` (default 1024) bounds the number of keys: beyond it the keys with traffic are kept first, then
an even spread of the rest.

A quantized model is traced as `quantize_` leaves it, before the backend's fusion passes; ``--calibrated`` records
the FFN fc1s that a calibrated, fused deployment serves with the act-quant GEMM under the op that GEMM reads
(`census_fused.py`).

Output (JSON)::

    {"schema": 1, "kind": "oasr-census", "service_mode": "offline", "keys": [{"batch", "frames", "traffic"}],
     "signatures": {"gemm|op=gemm|dt=half|N=1024|K=256": {"family", "op", "n", "k", "dtypes",
        "points": [{"m", "weight", "calls", "must_tune", "eager_fraction"}]}}}

``calls``: oasr.gemm calls at that M over the replayed workload (layers x batches hitting it); ``weight``: the
point's share of the census's GEMM FLOPs (calls x M x N x K, all points summing to 1); ``eager_fraction``: the
share of its calls issued eagerly (0 for traced, captured keys; from ``--capture`` recordings otherwise).

``--capture FILE`` merges an ``OASR_CAPTURE_GEMM=FILE`` recording (`oasr_ops.inductor.capture`): its calls are
eager, its points are not must-tune unless a key reaches them too.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from .census_keys import (DEFAULT_MAX_KEYS, DEFAULT_MAX_SECONDS, DEFAULT_STEPS,  # noqa: F401  (public names)
                          DEFAULT_TIME_GRANULARITY, Key, batch_buckets, chunk_input_frames, default_concurrency,
                          limit_keys, offline_keys, read_manifest, streaming_keys)


# ---------------------------------------------------------------------------------------------------- tracing

@dataclass
class TracedSite:
    signature: str          # dt=half spelling (the DB's family-wide signature)
    family: str
    op: str
    dtype: str
    n: int
    k: int
    m: int


@dataclass
class _Trace:
    fixed: dict[int, int]           # dynamic-slot index -> specialised value
    symbols: dict[int, Any]         # dynamic-slot index -> sympy Symbol
    ranges: dict[Any, Any]
    guards: list[Any]
    sites: list[tuple[str, str, str, str, int, int, Any, int]]  # (sig, family, op, dtype, n, k, m or expr, count)

    def fits(self, values: Sequence[int]) -> bool:
        import sympy

        subs = {}
        for i, v in enumerate(values):
            if i in self.fixed:
                if self.fixed[i] != v:
                    return False
            elif i in self.symbols:
                s = self.symbols[i]
                r = self.ranges.get(s)
                if r is not None and not (r.lower <= v <= r.upper):
                    return False
                subs[s] = sympy.Integer(v)
        for g in self.guards:
            try:
                if not bool(g.xreplace(subs)):
                    return False
            except TypeError:  # not decidable from the key alone
                return False
        return True

    def evaluate(self, values: Sequence[int]) -> list[TracedSite]:
        import sympy

        subs = {self.symbols[i]: sympy.Integer(v) for i, v in enumerate(values) if i in self.symbols}
        out = []
        for sig, fam, op, dt, n, k, m, count in self.sites:
            mv = m if isinstance(m, int) else int(m.xreplace(subs))
            out.extend([TracedSite(sig, fam, op, dt, n, k, mv)] * count)
        return out


def size_hint(x: Any) -> Any:
    """A symbolic size at its hint (an int); anything else as it is."""
    import torch

    if isinstance(x, torch.SymInt):
        h = x.node.hint
        return int(h) if h is not None else int(x.node.shape_env.size_hint(x.node.expr))
    return x


def describe_inputs(example_inputs: Sequence[Any]) -> list[Any]:
    """A graph's example inputs as `trace_sites` takes them without holding any tensor: (shape at its hints, dtype,
    device, requires_grad) per tensor, the hint of every other value (the backend's cache-hit record, prewarm)."""
    import torch

    return [(tuple(size_hint(s) for s in x.shape), x.dtype, x.device, x.requires_grad)
            if isinstance(x, torch.Tensor) else size_hint(x) for x in example_inputs]


def meta_stand_in(desc: tuple) -> tuple[Any, Any]:
    """(a meta tensor, the device it stands for) for one `describe_inputs` tuple: (shape, dtype, device[,
    requires_grad]). requires_grad matters: matmul folds a transposed 3-D input into an mm (a GEMM site) when the
    weight requires grad, as a parameter does even under no_grad, and keeps it a bmm when not."""
    import torch

    shape, dtype, device, *grad = desc
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=bool(grad and grad[0])), torch.device(device)


def fake_tensor(mode: Any, t: Any, symbolic_context: Any = None) -> Any:
    """A FakeTensor of `mode` for `t` (a tensor, or a `describe_inputs` tuple through `meta_stand_in`), static
    unless a `symbolic_context` is given, on the device `t` stands for."""
    import torch

    if not isinstance(t, torch.Tensor):
        t, real_device = meta_stand_in(t)
    else:
        real_device = t.device
    if symbolic_context is not None:
        f = mode.from_tensor(t, symbolic_context=symbolic_context)
    else:
        f = mode.from_tensor(t, static_shapes=True)
    if real_device.type != "meta" and f.device != real_device:
        f.fake_device = real_device  # a meta stand-in for a tensor of another device
    return f


def _decomps() -> dict:
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def trace_sites(fn: Callable[..., Any], tensor_args: Sequence[Any], dynamic: dict[int, list[int]] | None = None,
                *, bake: bool = False, arch: str | None = None, eager: bool = False) -> tuple[Any, Any, list[Any]]:
    """Trace ``fn(*args)`` on FakeTensors (`trace_graph`) and rewrite the graph with the backend's rewrite.

    ``bake``: resolve configs as the backend's pass does (the tuning report re-deriving a cache-hit graph); the
    census keeps ``False``. ``eager``: bake as for a graph run without CUDA graphs. Returns (RewriteResult,
    shape_env, fake args).
    """
    from ..families.graph import rewrite_graph

    gm, shape_env, fakes = trace_graph(fn, tensor_args, dynamic)
    res = rewrite_graph(gm.graph, bake=bake, arch=arch, eager=eager)
    return res, shape_env, fakes


def trace_graph(fn: Callable[..., Any], tensor_args: Sequence[Any],
                dynamic: dict[int, list[int]] | None = None) -> tuple[Any, Any, list[Any]]:
    """``fn(*args)`` traced by `make_fx` on FakeTensors with Inductor's decompositions: (graph module, shape_env,
    fake args); the graph's placeholders are the args, in order.

    ``tensor_args``: tensors (real or meta) or (shape, dtype, device[, requires_grad]) tuples (`meta_stand_in`:
    why requires_grad matters). ``dynamic``: arg index -> dims made symbolic (sizes 0/1 stay static).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    shape_env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    fakes = []
    for i, t in enumerate(tensor_args):
        dyn_dims = set((dynamic or {}).get(i, []))
        shape = t.shape if isinstance(t, torch.Tensor) else t[0]
        sizes = [DimDynamic.DYNAMIC if (d in dyn_dims and shape[d] > 1) else DimDynamic.STATIC
                 for d in range(len(shape))]
        fakes.append(fake_tensor(mode, t, StatelessSymbolicContext(dynamic_sizes=sizes)
                                 if any(s is DimDynamic.DYNAMIC for s in sizes) else None))
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=_decomps(), tracing_mode="symbolic")(*fakes)
    gm.graph.eliminate_dead_code()
    return gm, shape_env, fakes


class ModelTracer:
    """Traces a model once per shape class; keys are substitutions (see the module docstring)."""

    def __init__(self, model: Any, make_input: Callable[[int, int], tuple[tuple[int, ...], Any, Any]],
                 dynamic_dims: tuple[int | None, int | None], act_quant_pairs: dict[str, str] | None = None) -> None:
        import torch

        self.model = model
        # {fc2: fc1} of a calibrated, fused deployment: their fc1 sites are recorded under the act-quant op
        # (census_fused.py); None: the plain ops, as traced
        self.act_quant_pairs = act_quant_pairs
        self.make_input = make_input  # (batch, frames) -> (shape, dtype, device)
        self.dynamic_dims = dynamic_dims  # input dims holding (batch, frames); None = static
        self.params = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        self.names = list(self.params)
        self.traces: list[_Trace] = []
        self.skipped: dict[str, int] = {}
        self.not_censused: dict[str, int] = {}  # family -> sites whose family gives no census point
        self._torch = torch

    def _fn(self, *args: Any) -> Any:
        import torch

        params = dict(zip(self.names, args[:-1]))
        return torch.func.functional_call(self.model, params, (args[-1],))

    def _trace(self, batch: int, frames: int) -> _Trace:
        shape, dtype, device = self.make_input(batch, frames)
        dims = [d for d in self.dynamic_dims if d is not None]
        p_args = [self.params[n] for n in self.names]
        from ..families.graph import rewrite_graph

        gm, env, fakes = trace_graph(self._fn, [*p_args, (shape, dtype, device)], {len(p_args): dims})
        res = rewrite_graph(gm.graph, bake=False)
        fused_ops: dict[str, str] = {}
        if self.act_quant_pairs:
            from .census_fused import fused_site_ops

            fused_ops = fused_site_ops(gm.graph, res.sites, self.names, self.act_quant_pairs)
        x = fakes[-1]
        fixed, symbols = {}, {}
        for slot, d in enumerate(self.dynamic_dims):
            if d is None:
                continue
            s = x.shape[d]
            if isinstance(s, self._torch.SymInt) and not getattr(s.node.expr, "is_number", False):
                symbols[slot] = s.node.expr
            else:
                fixed[slot] = int(s)
        agg: dict[tuple, int] = {}
        from ..families.graph import census_points
        from ..families.graph import signature as graph_signature

        for site in res.sites:
            if site.node in fused_ops:  # an fc1 the fusion pass serves with the act-quant op (census_fused.py)
                op = fused_ops[site.node]
                site = replace(site, op=op, signature=graph_signature(site.family, op, site.dtype, site.n, site.k))
            points = census_points(site)  # the family's census recorder (families/graph.py has the contract)
            if not points:
                self.not_censused[site.family] = self.not_censused.get(site.family, 0) + 1
            for p in points:
                key = (p.signature, p.family, p.op, p.dtype, p.n, p.k, p.m)
                agg[key] = agg.get(key, 0) + 1
        for _node, why in res.skipped:
            self.skipped[why] = self.skipped.get(why, 0) + 1
        guards = [g.expr for g in env.guards]
        ranges = {s: env.var_to_range.get(s) for s in symbols.values()}
        return _Trace(fixed, symbols, ranges, guards, [(*k, c) for k, c in agg.items()])

    def sites(self, batch: int, frames: int) -> list[TracedSite]:
        slots_values = [batch, frames]
        for tr in self.traces:
            if tr.fits(slots_values):
                return tr.evaluate(slots_values)
        tr = self._trace(batch, frames)
        self.traces.append(tr)
        if not tr.fits(slots_values):  # pragma: no cover - a trace always fits its own key
            raise RuntimeError(f"trace for key ({batch}, {frames}) does not satisfy its own guards")
        return tr.evaluate(slots_values)


# ---------------------------------------------------------------------------------------------------- census

@dataclass
class Census:
    service_mode: str
    keys: list[Key]
    points: dict[str, dict[int, dict[str, Any]]]        # sig -> m -> {calls, captured_calls, eager_calls, must}
    meta: dict[str, dict[str, Any]]                     # sig -> {family, op, n, k, dtypes}
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        total = 0.0
        for sig, pts in self.points.items():
            n, k = self.meta[sig]["n"], self.meta[sig]["k"]
            for m, p in pts.items():
                total += p["calls"] * m * n * k
        sigs = {}
        for sig in sorted(self.points):
            md = self.meta[sig]
            pts = []
            for m in sorted(self.points[sig]):
                p = self.points[sig][m]
                calls = p["calls"]
                flops = calls * m * md["n"] * md["k"]
                pts.append({"m": m, "weight": (flops / total) if total else 0.0, "calls": int(round(calls)),
                            "must_tune": bool(p["must"]),
                            "eager_fraction": (p["eager_calls"] / calls) if calls else 0.0})
            sigs[sig] = {"family": md["family"], "op": md["op"], "n": md["n"], "k": md["k"],
                         "dtypes": sorted(md["dtypes"]), "points": pts}
        return {"schema": 1, "kind": "oasr-census", "service_mode": self.service_mode, **self.info,
                "keys": [{"batch": k.batch, "frames": k.frames, "traffic": k.traffic} for k in self.keys],
                "signatures": sigs}

    def add(self, site: TracedSite, calls: float, *, must: bool, eager: bool = False) -> None:
        self.meta.setdefault(site.signature, {"family": site.family, "op": site.op, "n": site.n, "k": site.k,
                                              "dtypes": set()})["dtypes"].add(site.dtype)
        p = self.points.setdefault(site.signature, {}).setdefault(
            site.m, {"calls": 0.0, "eager_calls": 0.0, "must": False})
        p["calls"] += calls
        if eager:
            p["eager_calls"] += calls
        p["must"] = p["must"] or must


def run_census(tracer: ModelTracer, keys: list[Key], service_mode: str, info: dict[str, Any] | None = None,
               progress: bool = False) -> Census:
    """`progress`: a tqdm bar over the keys on stderr (only when stderr is a terminal) and one log line per new
    trace (the slow part: a key that fits an earlier trace is a substitution)."""
    import logging

    from tqdm import tqdm

    log = logging.getLogger(__name__)
    c = Census(service_mode, keys, {}, {}, dict(info or {}))
    t0 = time.perf_counter()
    if progress:
        log.info("tracing %d graph key(s)", len(keys))
    bar = tqdm(keys, desc="census", unit="key", file=sys.stderr, disable=None if progress else True, leave=False)
    for key in bar:
        n = len(tracer.traces)
        for site in tracer.sites(key.batch, key.frames):
            c.add(site, key.traffic, must=True)
        if progress and len(tracer.traces) > n:
            log.info("trace %d (key batch=%d, frames=%d) at %.1fs", len(tracer.traces), key.batch, key.frames,
                     time.perf_counter() - t0)
    # The served weight working set decides whether the build measures with cold or warm weights.
    weight_bytes = sum(p.numel() * p.element_size() for p in tracer.model.parameters())
    c.info.update({"traces": len(tracer.traces), "trace_s": round(time.perf_counter() - t0, 3),
                   "stayed_on_aten": dict(tracer.skipped), "not_censused": dict(tracer.not_censused),
                   "weight_bytes": int(weight_bytes)})
    return c


def merge_capture(c: Census, path: str | Path) -> int:
    """Add an OASR_CAPTURE_GEMM recording's eager calls; returns the number of records merged."""
    from .capture_file import read_capture
    from . import database

    n = 0
    for r in read_capture(path):
        parts = database.parse_signature(r["signature"])
        if parts is None:
            continue
        sig = database.signature(parts.family, parts.op, "half", parts.n, parts.k)
        site = TracedSite(sig, parts.family, parts.op, r.get("dtype", "half"), parts.n, parts.k, int(r["m"]))
        c.add(site, float(r.get("calls", 1)), must=False, eager=True)
        n += 1
    return n


# ---------------------------------------------------------------------------------------------------- model


def input_maker(model: Any, info: dict[str, Any]) -> tuple[Callable[[int, int], Any], tuple[int, int | None]]:
    import itertools

    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"the census traces a torch.nn.Module, got {type(model).__name__}")
    # The input follows the weights' dtype and device; a model without parameters (a quantized one keeps its
    # weights in buffers, an activation has none) follows its first buffer, else fp16 on the CPU.
    p = next(itertools.chain(model.parameters(), model.buffers()), None)
    dtype = p.dtype if p is not None and p.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float16
    device = p.device if p is not None else torch.device("cpu")
    feat = int(info.get("n_mels", 80))
    layout = str(info.get("input_layout", "BTF")).upper()
    fixed = info.get("fixed_window")
    t_dim = None if fixed else (1 if layout == "BTF" else 2)

    def make(batch: int, frames: int):
        shape = (batch, frames, feat) if layout == "BTF" else (batch, feat, frames)
        return shape, dtype, device
    return make, (0, t_dim)


class CensusInputError(ValueError):
    """The model's forward rejects the input the census built from its ``census_info`` (the user's mismatch, not
    ours; the model's exception is the cause: the CLI reports both as one line naming the flags that shape the
    input)."""


def check_input_fits(model: Any, make: Callable[[int, int], tuple[tuple[int, ...], Any, Any]],
                     batch: int, frames: int) -> None:
    """Run the model once on a FakeTensor of the census's input for (``batch``, ``frames``): a model that expects
    another width or layout fails here with `CensusInputError` caused by its own exception, before a trace would
    bury it in a decomposition's traceback."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    shape, dtype, device = desc = make(batch, frames)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
        x = fake_tensor(mode, desc)
        try:
            model(x)
        except Exception as e:  # noqa: BLE001 - whatever the model raises is the message the user needs
            raise CensusInputError(f"the model's forward rejects the census input {list(shape)} ({dtype})") from e


def census_for_model(model: Any, info: dict[str, Any], *, service_mode: str, max_batch_size: int,
                     durations: Sequence[float] | None = None, time_granularity: int = DEFAULT_TIME_GRANULARITY,
                     max_seconds: float | None = None, chunk_size: int = 16, chunk_frames: int | None = None,
                     concurrency: dict[int, float] | None = None, concurrency_mean: float | None = None,
                     steps: int = DEFAULT_STEPS, max_keys: int | None = DEFAULT_MAX_KEYS,
                     progress: bool = False, act_quant_pairs: dict[str, str] | None = None) -> Census:
    """The census of `model` (already quantized where the deployment is). ``act_quant_pairs``: the {fc2: fc1}
    pairs of a calibrated deployment compiled with the quantization fusion (`census_fused.act_quant_pairs` of the
    full-precision model): their fc1 sites are recorded under the act-quant op the fused GEMM reads."""
    shift = float(info.get("frame_shift_ms", 10))
    fixed = info.get("fixed_window")
    if service_mode == "offline":
        max_frames = round(max_seconds * 1000 / shift) if max_seconds else None
        keys = offline_keys(durations or [], max_batch_size, frame_shift_ms=shift,
                            time_granularity=time_granularity, fixed_window=fixed, max_frames=max_frames)
    elif service_mode == "streaming":
        frames = int(fixed) if fixed else (chunk_frames or chunk_input_frames(chunk_size,
                                                                             int(info.get("subsampling", 1))))
        hist = concurrency or default_concurrency(max_batch_size, concurrency_mean)
        keys = streaming_keys(max_batch_size, frames, hist, steps)
    else:
        raise ValueError(f"service mode must be offline or streaming, got {service_mode!r}")
    keys = limit_keys(keys, max_keys)
    make, dims = input_maker(model, info)
    if keys:
        check_input_fits(model, make, keys[0].batch, keys[0].frames)
    tracer = ModelTracer(model, make, dims, act_quant_pairs)
    meta = {"max_batch_size": max_batch_size, "fixed_window": fixed,
            "time_granularity": None if fixed else time_granularity}
    if service_mode == "streaming":
        meta.update({"chunk_size": chunk_size, "chunk_frames": keys[0].frames if keys else None})
    return run_census(tracer, keys, service_mode, meta, progress=progress)
