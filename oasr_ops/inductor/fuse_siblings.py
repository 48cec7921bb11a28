"""The backend's sibling-GEMM pass (opt-in, ``options={"fuse_siblings": True}``): int8 GEMMs that read the same quantized input become one wider GEMM, on Dynamo's graph (issue 15).

Matched: two or more ``oasr.scaled_mm(a, w_i, scale_a, scale_w_i, bias_i, out_dtype, config_i)`` calls with the
same `a` node, the same `scale_a` node, the same out_dtype and K: an attention block's query / key / value after
`fuse_quant` gave them one `oasr.layer_norm_quant` (``fuse_quantization=True``; with ``"act"`` or without it each
linear quantizes its own input, so there are no siblings to find). Rewritten to::

    y = scaled_mm(a, cat([w_1, .., w_n]), scale_a, cat([sw_1, .., sw_n]), cat([b_1, .., b_n]), out_dtype, cfg)
    out_i = narrow(y, -1, offset_i, N_i)         # a column slice: a strided view [M, N_i], row stride sum(N)

Per column the arithmetic is the same as the sibling's own GEMM (the exact int32 accumulator, then
``scale_a * scale_w * acc + bias`` in fp32, rounded once), so the result is bit-identical. A missing bias becomes
zeros of its width in the out_dtype (``y + 0`` is y), computed from that weight so that freezing folds it too;
all-None stays None. ``cfg``: "auto" (the post-grad rewrite then picks the DB entry or the int8 heuristic for the
fused N), except when every sibling named the same explicit config: that pin is kept (a tile is valid for any
N % 8, and the user chose it); mixed pins fall back to "auto".

Why it can pay: one launch instead of n, and a wave count rounded up once instead of n times (Whisper small's
q/k/v: M = 12000, N = 768, K = 768, ~22 us each on the H200; fused N = 2304). What it costs: the weights, scales and
biases are graph inputs (buffers of `QuantLinear`), so the ``cat``s run on every call: 3 x 768 x 768 int8 = 1.7 MB
read and written per Whisper-small layer, plus two small cats (Inductor's kernels, memory-bound, a few us).
Under Inductor's freezing (``torch._inductor.config.freezing = True`` set before compiling, not as an
``options`` entry: Dynamo decides while tracing whether the weights are graph inputs) they are constants and
Inductor's constant folding turns every cat into a frozen tensor: paid once (tests/test_fuse_siblings.py; the
benchmark's ``--with-freezing`` variants). Measured on the H200 (docs/perf/e2e.md, session 7): Whisper-style small
synchronous calls 2.7-3.2 % faster in three runs, calls back to back 0.3-1.2 % slower (the cats included; the
freezing and profile variants were not run): a latency / throughput trade, hence opt-in.

The column slices are strided. Every ATen op reads a strided tensor; only ``view`` can refuse one (a view that
merges the sliced rows with the columns), so within the chain of views after a sibling (``reshape``, ``view``,
``transpose``, ...) ``view`` / ``view_as`` become ``reshape`` / ``reshape_as``: the same values, a view whenever
one exists (Whisper's ``.view(b, t, h, hd).transpose(1, 2)`` splits only the columns: no copy), a copy otherwise.
Not fused (the site is reported): a sibling whose output, through views, is returned by the graph (the caller
would get a strided tensor where it had a contiguous one) or is modified in place (the view semantics of a
mutation would change) or read by a linear (the backend's fp16 GEMM rewrite serves only inputs known to be
contiguous: a strided one would fall back to ATen's mm, and a copy costs an [M, N_i] round trip, more than the
fusion saves); weights, scales or biases that are not computed from graph inputs / constants alone (they
are hoisted to the first sibling), or whose shape is not static; a fused N that is not a multiple of 8.

Why on Dynamo's graph: the same as `fuse_quant` (our ops and the views are single nodes there, and the result is
what AOTAutograd traces, so Inductor's cache key covers it). It runs after `fuse_residual`: a GEMM whose output
only feeds a residual add is an `oasr.scaled_mm_residual` by then (that fusion saves more) and is left alone.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch

from ..families.quant_patterns import _LINEARS, _SCALED_MM, eliminate_dead_code, mutates_in_place, restore_rows
from .pass_log import PassLog

N_ALIGN = 8   # the int8 kernels write output rows 128 bits at a time (ops._check: N % 8)
K_ALIGN = 16  # and read int8 operands 16 at a time (K % 16)

# ops whose result may alias their input (followed when checking what a sibling's output reaches)
_ALIAS_METHODS = {"reshape", "view", "view_as", "reshape_as", "transpose", "permute", "t", "unsqueeze", "squeeze",
                  "flatten", "unflatten", "expand", "expand_as", "narrow", "select", "split", "chunk", "unbind",
                  "contiguous", "to", "float", "half", "bfloat16", "type_as", "detach", "__getitem__"}
_ALIAS_FUNCTIONS = {restore_rows, torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.narrow,
                    torch.split, torch.chunk, torch.unbind, torch.t, torch.squeeze, torch.unsqueeze, torch.select,
                    operator.getitem, torch.Tensor.contiguous}
_VIEW_TO_RESHAPE = {"view": "reshape", "view_as": "reshape_as"}
# what a weight / scale / bias may be computed by (from graph inputs and constants alone): slices of a
# `QuantLinear`'s ``scales`` buffer, the in-graph weight quantization of ``options={"quantization": ...}``
_PARAM_METHODS = {"contiguous", "float", "to", "half", "bfloat16", "reshape", "view", "detach"}


@dataclass
class SiblingReport:
    groups: int = 0                                     # sibling groups served by one oasr.scaled_mm
    widths: list[list[int]] = field(default_factory=list)  # each group's N per sibling, in graph order
    views_to_reshape: int = 0                           # `view` calls after a sibling turned into `reshape`
    unfused: list[str] = field(default_factory=list)    # groups (or siblings) left as they were, and why


# every report of this process, oldest first, bounded: `SIBLING_LOG.mark()` before a compile and
# `SIBLING_LOG.since(mark)` after it read that compile's reports (pass_log.py says why not a length)
SIBLING_LOG: PassLog[SiblingReport] = PassLog()


def sibling_log() -> list[SiblingReport]:
    """The reports kept (the last 64), oldest first."""
    return SIBLING_LOG.entries()


def _arg(node: torch.fx.Node, i: int, name: str, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _static_shape(n) -> tuple[int, ...] | None:
    """The static shape of a weight-like node: its traced value, else (nodes our passes inserted carry none)
    derived from what `quantize_pass` spells out: ``getitem(quantize_weight(w), 0 | 1)``."""
    if not isinstance(n, torch.fx.Node):
        return None
    v = n.meta.get("example_value")
    if isinstance(v, torch.Tensor):
        return tuple(v.shape) if all(isinstance(s, int) for s in v.shape) else None
    if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node):
        src = n.args[0]
        if src.op == "call_function" and len(src.args) == 1 and getattr(src.target, "__name__", "").startswith(
                "quantize_weight"):
            w = _static_shape(src.args[0])
            if w is not None and len(w) == 2:
                return w if n.args[1] == 0 else (w[0],)
    return None


def _param_closure(n, out: list[torch.fx.Node]) -> bool:
    """Whether `n` is computed from placeholders / get_attr alone (collecting the computing nodes, inputs first,
    in `out`): only then can it be moved up to the first sibling."""
    if n is None:
        return True
    if not isinstance(n, torch.fx.Node):
        return False
    if n in out or n.op == "placeholder":  # Dynamo's placeholders come first
        return True
    if n.op == "get_attr":  # no inputs; under freezing Dynamo emits the weights as get_attr at their first use
        out.append(n)
        return True
    ok = n.op == "call_method" and n.target in _PARAM_METHODS
    ok = ok or (n.op == "call_function" and (n.target is operator.getitem
                                             or getattr(n.target, "__name__", "").startswith("quantize_weight")))
    if not ok:
        return False
    for i in n.all_input_nodes:
        if not _param_closure(i, out):
            return False
    out.append(n)
    return True


def _aliases(u: torch.fx.Node) -> bool:
    if u.op == "call_method":
        return u.target in _ALIAS_METHODS
    return u.op == "call_function" and u.target in _ALIAS_FUNCTIONS


def _output_views(gemm: torch.fx.Node) -> tuple[list[torch.fx.Node], str | None]:
    """The `view` / `view_as` nodes among the aliases of `gemm`'s output (to become reshapes), or why the output
    cannot become a column slice (returned by the graph, modified in place)."""
    views, seen, todo = [], set(), [gemm]
    while todo:
        n = todo.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            if u.op == "output":
                return [], "its output is returned by the graph (the caller would get a strided view)"
            if mutates_in_place(u):
                return [], f"its output is modified in place ({u.target})"
            if u.op == "call_function" and u.target in _LINEARS and u.args and u.args[0] is n:
                return [], ("its output feeds a linear (the GEMM rewrite takes only contiguous inputs, and a copy "
                            "costs more than the fusion saves)")
            if _aliases(u):
                if u.op == "call_method" and u.target in _VIEW_TO_RESHAPE and u.args[0] is n:
                    views.append(u)
                todo.append(u)
    return views, None


@dataclass
class _Sibling:
    node: torch.fx.Node
    n: int
    k: int
    w: torch.fx.Node
    scale_w: torch.fx.Node
    bias: torch.fx.Node | None
    config: str
    hoist: list[torch.fx.Node]
    views: list[torch.fx.Node]


def _sibling(node: torch.fx.Node) -> tuple[_Sibling | None, str | None]:
    a, w, sa, sw = node.args[:4]
    bias = _arg(node, 4, "bias")
    config = _arg(node, 6, "config", "auto")
    ws, sws = _static_shape(w), _static_shape(sw)
    bs = _static_shape(bias) if bias is not None else None
    if ws is None or len(ws) != 2 or sws is None or (bias is not None and bs is None):
        return None, "a weight, scale or bias without a static shape"
    hoist: list[torch.fx.Node] = []
    if not all(_param_closure(x, hoist) for x in (w, sw, bias)):
        return None, "a weight, scale or bias computed from more than graph inputs / constants"
    views, why = _output_views(node)
    if why is not None:
        return None, why
    return _Sibling(node, ws[0], ws[1], w, sw, bias, config if isinstance(config, str) else "auto", hoist,
                    views), None


def _zeros_from(g: torch.fx.Graph, w: torch.fx.Node, out_dtype: torch.dtype) -> torch.fx.Node:
    """Zeros [N] in `out_dtype` computed from the int8 weight [N, K] (``w[:, 0] - w[:, 0]``, exact in int8), not a
    constructor: Inductor's constant folding skips constructors (``aten.full``; ``x * 0`` is simplified into one),
    so under freezing a cat with ``new_zeros`` would stay a per-call kernel, while this one folds with the weights.
    Without freezing Inductor fuses the pointwise into the cat."""
    col = g.call_function(operator.getitem, (w, (slice(None), 0)))
    return g.call_method("to", (g.call_function(operator.sub, (col, col)), out_dtype))


def _fuse(g: torch.fx.Graph, sibs: list[_Sibling], out_dtype: torch.dtype, rep: SiblingReport) -> None:
    first = sibs[0].node
    hoisted: list[torch.fx.Node] = []
    order = {n: i for i, n in enumerate(g.nodes)}
    for n in sorted({h for s in sibs for h in s.hoist}, key=order.__getitem__):
        if order[n] > order[first]:
            first.prepend(n)  # weight-only nodes (inputs first): valid anywhere before their users
        hoisted.append(n)
    configs = {s.config for s in sibs}
    config = configs.pop() if len(configs) == 1 else "auto"
    any_bias = any(s.bias is not None for s in sibs)
    with g.inserting_before(first):
        w = g.call_function(torch.cat, ([s.w for s in sibs], 0))
        sw = g.call_function(torch.cat, ([s.scale_w for s in sibs], 0))
        bias = None
        if any_bias:
            parts = [s.bias if s.bias is not None else _zeros_from(g, s.w, out_dtype) for s in sibs]
            bias = g.call_function(torch.cat, (parts, 0))
        a, sa = first.args[0], first.args[2]
        y = g.call_function(torch.ops.oasr.scaled_mm.default, (a, w, sa, sw, bias, out_dtype, config))
        offset = 0
        slices = []
        for s in sibs:
            slices.append(g.call_function(torch.narrow, (y, -1, offset, s.n)))
            offset += s.n
    for s, sl in zip(sibs, slices):
        for v in s.views:
            v.target = _VIEW_TO_RESHAPE[v.target]
            rep.views_to_reshape += 1
        s.node.replace_all_uses_with(sl)
        g.erase_node(s.node)
    rep.groups += 1
    rep.widths.append([s.n for s in sibs])


def fuse_sibling_gemms(gm: torch.fx.GraphModule) -> SiblingReport:
    """Rewrite every group of sibling int8 GEMMs of `gm` in place (module docstring); returns what was fused."""
    rep = SiblingReport()
    SIBLING_LOG.append(rep)
    g = gm.graph
    groups: dict[tuple, list[torch.fx.Node]] = {}
    for n in g.nodes:
        if n.op == "call_function" and n.target in _SCALED_MM:
            out_dtype = _arg(n, 5, "out_dtype", torch.float16)
            w = _static_shape(n.args[1])
            groups.setdefault((n.args[0], n.args[2], out_dtype, None if w is None else w[-1]), []).append(n)
    changed = False
    for (a, _sa, out_dtype, k), nodes in groups.items():
        if len(nodes) < 2:
            continue
        names = ", ".join(n.name for n in nodes)
        if k is None or k % K_ALIGN:
            rep.unfused.append(f"{names}: K unknown or not a multiple of {K_ALIGN}")
            continue
        sibs = []
        for n in nodes:
            s, why = _sibling(n)
            if s is None:
                rep.unfused.append(f"{n.name}: {why}")
            else:
                sibs.append(s)
        if len(sibs) < 2:
            continue
        if any(s.k != k for s in sibs):  # grouped by the weight's K already; a mismatch is a malformed graph
            rep.unfused.append(f"{names}: weights of different K")
            continue
        total = sum(s.n for s in sibs)
        if total % N_ALIGN:
            rep.unfused.append(f"{names}: the fused N={total} is not a multiple of {N_ALIGN}")
            continue
        _fuse(g, sibs, out_dtype, rep)
        changed = True
    if changed:
        eliminate_dead_code(g)
        g.lint()
        gm.recompile()
    return rep
