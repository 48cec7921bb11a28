"""The graph rewrite: ATen Linear GEMMs (+ a fusable activation) -> `torch.ops.oasr.gemm`, `bmm` ->
`torch.ops.oasr.bmm`, configs baked in.

Runs as Inductor's `post_grad_custom_pre_pass` (one `CustomGraphPass` object, torch 2.11-compatible) and, with
``bake=False``, inside the traced census (`oasr_ops.tune.census`), so the census sees exactly the sites the
backend rewrites.

What it matches (functional, decomposed ATen, as the post-grad pre-pass sees it)::

    mm(a, permute(W, [1, 0]))            ->  oasr.gemm(a, W, None, act, cfg)
    addmm(bias, a, permute(W, [1, 0]))   ->  oasr.gemm(a, W, bias, act, cfg)

``t(W)`` / ``transpose(W, 0, 1)`` are accepted for the permute; a 3-D Linear input is already ``reshape`` + mm
and keeps its reshapes. An activation directly after the GEMM (through the 2-D -> 3-D reshape) is fused when the
GEMM output has no other user: ``relu``, erf-``gelu`` and ``silu``, either as their ATen ops or as the
decompositions Inductor's table produces (``convert(fp32) -> neg -> exp -> add 1 -> div -> convert`` for SiLU,
``0.5x * (1 + erf(x/sqrt 2))`` for GELU). tanh-GELU is never fused (the kernels' GELU is the erf one).

What stays on aten (the reason is recorded in `RewriteResult.skipped`): a dtype other than fp16/bf16 (or mixed),
N or K not a multiple of 8 or not static, a weight that is not a transposed contiguous 2-D graph input/attribute
(a parameter: placeholder after AOTAutograd, get_attr under freezing), an input not known to be contiguous, a
bias that is not 1-D [N], addmm with alpha/beta != 1, a device other than CPU/CUDA.

``bmm(a [L, M, K], b [L, K, N])`` (what `torch.matmul` of attention lowers to) -> ``oasr.bmm(a, b, cfg)`` when
the dtype is fp16/bf16, N and K are static, N % 8 == K % 8 == 0, and the traced strides show a K-contiguous a
and a b with N or K contiguous (op ``bmm`` / ``bmm_nn``, family ``bmm``; `oasr_ops/bmm.py`). The op carries
`needs_fixed_stride_order`, so Inductor keeps those strides. Its M axis for selection is L * M (symbolic when the
batch or the sequence is: a region table is baked, as for gemm).

Configs: a static M bakes `select_config(...).config` (a concrete id or a sentinel); a symbolic M bakes the
signature's region table (`library.format_table(select.region_table(...))`), resolved per call. A table whose
answer depends on M beyond the DB (a cost model or registered heuristic: ``auto`` rows) is baked as ``auto``
except for a trailing ``auto`` row, which the op already treats as "past the end -> auto".

Every rewrite is logged (`rewrite_log()`): on an FX/AOT cache hit the pass does not run, so the log only holds
graphs this process actually rewrote. Everything a compiled graph needs is in the graph itself.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

aten = torch.ops.aten
prims = torch.ops.prims

LOW_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_VIEW_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_ALIGN = 8


@dataclass
class GemmSite:
    """One rewritten (or, in the census, would-be rewritten) GEMM."""

    signature: str          # the DB signature (dtype-specific spelling, as select_config returns it)
    family: str
    op: str                 # gemm | gemm_activation
    dtype: str              # fp16 | bf16
    n: int
    k: int
    m: int | None           # None when symbolic (a region table was baked)
    m_expr: Any = None      # the sympy expression of a symbolic M (census substitutes keys into it)
    m_hint: int | None = None  # M of the example inputs (a symbolic M's hint), when known
    activation: str = "none"
    bias: bool = False
    config: str = "auto"    # what was baked into the graph
    tier: str = ""          # the tier that answered (static M) or, for a baked table, the highest tier with an entry
    node: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("signature", "family", "op", "dtype", "n", "k", "m", "activation",
                                             "bias", "config", "tier", "node")}
        if self.m is None and self.m_expr is not None:
            d["m_expr"] = str(self.m_expr)
        return d


@dataclass
class RewriteResult:
    sites: list[GemmSite] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (node name, reason)
    epoch: int = -1  # the DB epoch the configs were baked in (-1: not baked)


_LOG: list[RewriteResult] = []
_LOG_LOCK = threading.Lock()


def rewrite_log() -> list[RewriteResult]:
    """Every graph the backend's pass rewrote in this process (oldest first)."""
    with _LOG_LOCK:
        return list(_LOG)


def clear_rewrite_log() -> None:
    with _LOG_LOCK:
        _LOG.clear()


# ------------------------------------------------------------------------------------------------ helpers

def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _static_int(x: Any) -> int | None:
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        e = x.node.expr
        if getattr(e, "is_number", False):
            return int(e)
    return None


def _known_contiguous(t: torch.Tensor) -> bool:
    try:
        from torch._prims_common import is_contiguous_or_false
        return bool(is_contiguous_or_false(t))
    except ImportError:  # older torch: is_contiguous may guard on a symbolic shape; that is fine there
        try:
            return bool(t.is_contiguous())
        except Exception:
            return False


def _weight_source(node: Any) -> torch.fx.Node | None:
    """W when `node` is permute(W, [1, 0]) / t(W) / transpose(W, 0, 1) of a 2-D graph input or attribute."""
    if _is(node, aten.permute.default):
        dims = [int(d) % 2 for d in node.args[1]]
        if dims != [1, 0]:
            return None
    elif _is(node, aten.t.default):
        pass
    elif _is(node, aten.transpose.int):
        if sorted(int(d) % 2 for d in node.args[1:3]) != [0, 1]:
            return None
    else:
        return None
    src = node.args[0]
    if not isinstance(src, torch.fx.Node) or src.op not in ("placeholder", "get_attr"):
        return None
    v = _val(src)
    if not isinstance(v, torch.Tensor) or v.dim() != 2 or not _known_contiguous(v):
        return None
    return src


_META_OPS = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}


def _users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Users that read values (shape queries such as `sym_size` of a symbolic trace do not count)."""
    return [u for u in node.users if not _is(u, *_META_OPS)]


def _single_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = _users(node)
    return users[0] if len(users) == 1 else None


def _scalar_is(x: Any, value: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(float(x) - value) < 1e-9


def _is_convert(node: Any, dtype: torch.dtype) -> bool:
    return _is(node, prims.convert_element_type.default) and node.args[1] == dtype


def _other(node: torch.fx.Node, x: Any) -> Any:
    """The other argument of a binary op whose one argument is `x` (None when x is not an argument)."""
    a, b = node.args[0], node.args[1]
    if a is x:
        return b
    if b is x:
        return a
    return None


def _match_silu(c: torch.fx.Node, dtype: torch.dtype) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    users = _users(c)
    if len(users) != 2:
        return None
    neg = next((u for u in users if _is(u, aten.neg.default)), None)
    div = next((u for u in users if _is(u, aten.div.Tensor)), None)
    if neg is None or div is None or div.args[0] is not c:
        return None
    exp = _single_user(neg)
    if not _is(exp, aten.exp.default):
        return None
    add = _single_user(exp)
    if not _is(add, aten.add.Tensor) or not _scalar_is(_other(add, exp), 1.0) or add.kwargs.get("alpha", 1) != 1:
        return None
    if _single_user(add) is not div or div.args[1] is not add:
        return None
    end = _single_user(div)
    if not _is_convert(end, dtype):
        return None
    return end, [end, div, add, exp, neg, c]


def _match_gelu(c: torch.fx.Node, dtype: torch.dtype) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    users = _users(c)
    if len(users) != 2 or not all(_is(u, aten.mul.Tensor) for u in users):
        return None
    half = next((u for u in users if _scalar_is(_other(u, c), 0.5)), None)
    scale = next((u for u in users if _scalar_is(_other(u, c), 0.7071067811865476)), None)
    if half is None or scale is None or half is scale:
        return None
    erf = _single_user(scale)
    if not _is(erf, aten.erf.default):
        return None
    add = _single_user(erf)
    if not _is(add, aten.add.Tensor) or not _scalar_is(_other(add, erf), 1.0) or add.kwargs.get("alpha", 1) != 1:
        return None
    mul = _single_user(add)
    if not _is(mul, aten.mul.Tensor) or _single_user(half) is not mul or _other(mul, add) is not half:
        return None
    end = _single_user(mul)
    if not _is_convert(end, dtype):
        return None
    return end, [end, mul, add, erf, scale, half, c]


def match_activation(x: torch.fx.Node, dtype: torch.dtype) -> tuple[str, torch.fx.Node, list[torch.fx.Node]] | None:
    """(activation, last node, chain nodes to erase) when `x`'s only consumer is a fusable activation."""
    u = _single_user(x)
    if u is None:
        return None
    if _is(u, aten.relu.default):
        return "relu", u, [u]
    if _is(u, aten.silu.default):
        return "silu", u, [u]
    if _is(u, aten.gelu.default) and u.kwargs.get("approximate", "none") == "none" and len(u.args) == 1:
        return "gelu", u, [u]
    if _is_convert(u, torch.float32):
        for name, fn in (("silu", _match_silu), ("gelu", _match_gelu)):
            hit = fn(u, dtype)
            if hit is not None:
                return name, hit[0], hit[1]
    return None


# ------------------------------------------------------------------------------------------------ matching

@dataclass
class _Candidate:
    node: torch.fx.Node         # the mm / addmm
    a: torch.fx.Node
    w: torch.fx.Node            # the weight source (placeholder / get_attr), [N, K]
    wt: torch.fx.Node           # the permute node
    bias: torch.fx.Node | None
    dtype: torch.dtype
    n: int
    k: int
    m: Any                      # int or SymInt


def _operands_reason(vals: tuple, n_k) -> str | None:
    """Why fake values `vals` (the first is a) and the GEMM's (N, K) = `n_k()` keep a site on aten, or None."""
    if not all(isinstance(t, torch.Tensor) for t in vals):
        return "no fake value"
    av = vals[0]
    if av.dtype not in LOW_DTYPES or any(t.dtype != av.dtype for t in vals):
        return f"dtype {av.dtype}/{vals[1].dtype} (fp16/bf16 only)"
    if av.device.type not in ("cpu", "cuda", "meta"):
        return f"device {av.device}"
    n, k = (_static_int(x) for x in n_k())
    if n is None or k is None:
        return "symbolic N or K"
    if n % _ALIGN or k % _ALIGN:
        return f"N={n} K={k} not multiples of {_ALIGN}"
    return None


def _candidate(node: torch.fx.Node) -> tuple[_Candidate | None, str]:
    if _is(node, aten.mm.default):
        a, wt = node.args[0], node.args[1]
        bias = None
    else:  # addmm
        bias, a, wt = node.args[0], node.args[1], node.args[2]
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None, "addmm with alpha/beta != 1"
    w = _weight_source(wt)
    if w is None:
        return None, "weight is not a transposed contiguous 2-D parameter"
    av, wv, ov = _val(a), _val(w), _val(node)
    why = _operands_reason((av, wv, ov), lambda: (wv.shape[0], wv.shape[1]))
    if why:
        return None, why
    n, k = _static_int(wv.shape[0]), _static_int(wv.shape[1])
    if av.dim() != 2 or not _known_contiguous(av):
        return None, "input not known to be contiguous"
    if bias is not None:
        bv = _val(bias)
        if not isinstance(bias, torch.fx.Node) or not isinstance(bv, torch.Tensor) or bv.dim() != 1 \
                or _static_int(bv.shape[0]) != n or bv.dtype != av.dtype or not _known_contiguous(bv):
            return None, "bias is not a contiguous 1-D [N] tensor of the input dtype"
    return _Candidate(node, a, w, wt, bias, av.dtype, n, k, av.shape[0]), ""


def _bake(family: str, op: str, dtype: str, n: int, k: int, m: int | None, arch: str | None) -> tuple[str, str, str]:
    """(config string, tier, signature) to put into the graph."""
    from ..runtime.plans import format_table
    from ..runtime import select

    if m is not None:
        s = select.select_config(family, op, dtype, n, k, m, arch)
        return s.config, s.tier, _signature(family, op, dtype, n, k)
    table = select.region_table(family, op, dtype, n, k, arch)
    sig = _signature(family, op, dtype, n, k)
    tier = _table_tier(family, op, dtype, n, k, arch)
    if table and table[-1][1] == "auto":
        table = table[:-1]
    if not table or any(cfg == "auto" for _, cfg in table):
        return "auto", tier, sig
    return format_table([(hi, cfg) for hi, cfg in table]), tier, sig


def _table_tier(family: str, op: str, dtype: str, n: int, k: int, arch: str | None) -> str:
    """For a baked table: the highest DB tier with an entry for the signature, else the fallback tier."""
    from ..runtime import database
    from ..runtime.arch import current_arch_family, normalize_arch

    a = normalize_arch(arch) if arch else current_arch_family()
    if a is not None:
        for tier, _e in database.chain(family, op, dtype, n, k, a):
            return tier
    return "default"


def _signature(family: str, op: str, dtype: str, n: int, k: int) -> str:
    from ..runtime import database

    return database.signature(family, op, dtype, n, k)


# A site whose baked answer is cuBLAS for every M keeps its aten node: `oasr.gemm(..., "torch")` would run the same
# cuBLAS call but pin the operands' strides (`needs_fixed_stride_order`) and hide the epilogue from Inductor's
# fusion — measured slower end to end than leaving the node alone (docs/perf/e2e.md). The site is still recorded
# (tuning report, census); a DB change recompiles (the pass's uuid covers the DB), so a later entry takes effect.
_ATEN_CONFIGS = frozenset({"torch", "regions:*=torch"})


def _m_expr_hint(m_int: int | None, m: Any) -> tuple[Any, int | None]:
    """(sympy expression, hint) of a symbolic M; (None, M) for a static one."""
    if m_int is not None or not isinstance(m, torch.SymInt):
        return None, m_int
    try:
        hint = int(m.node.hint) if m.node.hint is not None else None
    except Exception:
        hint = None
    return m.node.expr, hint


def _aten_site(sig, family, op, dt, n, k, m_int, m, activation, bias, config, tier, node) -> GemmSite:
    m_expr, m_hint = _m_expr_hint(m_int, m)
    return GemmSite(sig, family, op, dt, n, k, m_int, m_expr, m_hint, activation, bias, config, tier,
                    f"{node.name} (kept on aten)")


def rewrite_graph(graph: torch.fx.Graph, *, bake: bool = True, arch: str | None = None,
                  log: bool = False) -> RewriteResult:
    """Rewrite every eligible mm/addmm of `graph` in place into `oasr.gemm`; returns what it did.

    ``bake=False`` (the census) inserts ``config="auto"`` and resolves nothing.
    """
    res = RewriteResult()
    if bake:
        from ..runtime import database
        res.epoch = database.epoch()
    gemm_op = torch.ops.oasr.gemm.default
    for node in list(graph.nodes):
        if not _is(node, aten.mm.default, aten.addmm.default):
            continue
        cand, why = _candidate(node)
        if cand is None:
            res.skipped.append((node.name, why))
            continue
        # The activation: directly after the GEMM, or after its single-user 2-D -> N-D reshape.
        out = node
        view = _single_user(node)
        if view is not None and _is(view, *_VIEW_OPS):
            out = view
        act = match_activation(out, cand.dtype)
        activation, end, chain = ("none", None, []) if act is None else act
        if activation != "none" and _single_user(node) is None:
            activation, end, chain = "none", None, []
        dt = LOW_DTYPES[cand.dtype]
        op = "gemm" if activation == "none" else "gemm_activation"
        m_int = _static_int(cand.m)
        if bake:
            config, tier, sig = _bake("gemm", op, dt, cand.n, cand.k, m_int, arch)
        else:
            config, tier, sig = "auto", "", _signature("gemm", op, dt, cand.n, cand.k)
        if config in _ATEN_CONFIGS:
            res.sites.append(_aten_site(sig, "gemm", op, dt, cand.n, cand.k, m_int, cand.m, activation,
                                        cand.bias is not None, config, tier, node))
            continue
        with graph.inserting_before(node):
            new = graph.call_function(gemm_op, (cand.a, cand.w, cand.bias, activation, config))
        new.meta.update({k: v for k, v in node.meta.items() if k in ("val", "tensor_meta", "stack_trace",
                                                                        "nn_module_stack", "source_fn_stack")})
        node.replace_all_uses_with(new)
        if end is not None:
            keep = out if out is not node else new
            end.replace_all_uses_with(keep)
            for c in chain:  # last node first: each has no value users once its consumer is gone
                for u in list(c.users):  # shape queries: the chain is pointwise, `keep` has the same shape
                    if _is(u, *_META_OPS):
                        u.replace_input_with(c, keep)
                if not c.users:
                    graph.erase_node(c)
        graph.erase_node(node)
        if not cand.wt.users:
            graph.erase_node(cand.wt)
        m_expr, m_hint = _m_expr_hint(m_int, cand.m)
        res.sites.append(GemmSite(sig, "gemm", op, dt, cand.n, cand.k, m_int, m_expr, m_hint, activation,
                                  cand.bias is not None, config, tier, new.name))
    _scaled_mm_sites(graph, res, bake, arch)
    _bmm_sites(graph, res, bake, arch)
    if log:
        with _LOG_LOCK:
            _LOG.append(res)
    return res


def _scaled_mm_sites(graph: torch.fx.Graph, res: RewriteResult, bake: bool, arch: str | None) -> None:
    """A quantized model (`quantize_`) already calls `oasr.scaled_mm[_quant]`: record those sites (the census
    sees them) and, when baking, replace their `config="auto"` by the selection (static M) or the region table
    (symbolic M), exactly as for gemm."""
    import importlib

    smm = importlib.import_module("oasr_ops.families.scaled_mm.ops")
    ops = {torch.ops.oasr.scaled_mm.default: "scaled_mm", torch.ops.oasr.scaled_mm_quant.default: "scaled_mm_quant"}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in ops:
            continue
        op = ops[node.target]
        a, w = node.args[0], node.args[1]
        aval = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        wval = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if aval is None or wval is None or wval.dim() != 2:
            res.skipped.append((node.name, "scaled_mm operand without a known shape"))
            continue
        n, k = int(wval.shape[0]), int(wval.shape[1])
        m = aval.numel() // k
        m_int = _static_int(m)
        config, tier = node.args[6], ""
        if bake and config == "auto":
            if m_int is not None:
                sel = (smm.select_quant_config if op == "scaled_mm_quant" else smm.select_config)(n, k, m_int, arch)
                config, tier = sel.config, sel.tier
            else:
                config, tier, _sig = _bake("scaled_mm", op, "int8", n, k, None, arch)
            node.args = (*node.args[:6], config)
        m_expr, m_hint = _m_expr_hint(m_int, m)
        res.sites.append(GemmSite(smm.signature(op, n, k), "scaled_mm", op, "int8", n, k, m_int, m_expr, m_hint,
                                  "none", node.args[4] is not None, config, tier, node.name))


def _bmm_candidate(node: torch.fx.Node) -> tuple[tuple[str, str, int, int, Any] | None, str]:
    """(op, dtype name, n, k, rows = L * M) of a rewritable bmm, or the reason it stays on aten."""
    a, b = node.args[0], node.args[1]
    av, bv = _val(a), _val(b)
    why = _operands_reason((av, bv), lambda: (bv.shape[2], av.shape[2]))
    if why:
        return None, f"bmm {why}"
    n, k = _static_int(bv.shape[2]), _static_int(av.shape[2])
    a_k, b_n, b_k = (_static_int(x) for x in (av.stride(2), bv.stride(2), bv.stride(1)))
    if a_k != 1:
        return None, "bmm a is not K-contiguous"
    if b_n == 1:
        op = "bmm_nn"
    elif b_k == 1:
        op = "bmm"
    else:
        return None, "bmm b has neither N nor K contiguous"
    return (op, LOW_DTYPES[av.dtype], n, k, av.shape[0] * av.shape[1]), ""


def _bmm_sites(graph: torch.fx.Graph, res: RewriteResult, bake: bool, arch: str | None) -> None:
    """aten.bmm -> oasr.bmm (module docstring); the config is baked as for gemm, over rows = L * M."""
    bmm_op = torch.ops.oasr.bmm.default
    for node in list(graph.nodes):
        if not _is(node, aten.bmm.default):
            continue
        cand, why = _bmm_candidate(node)
        if cand is None:
            res.skipped.append((node.name, why))
            continue
        op, dt, n, k, rows = cand
        m_int = _static_int(rows)
        if bake:
            config, tier, sig = _bake("bmm", op, dt, n, k, m_int, arch)
        else:
            config, tier, sig = "auto", "", _signature("bmm", op, dt, n, k)
        if config in _ATEN_CONFIGS:
            res.sites.append(_aten_site(sig, "bmm", op, dt, n, k, m_int, rows, "none", False, config, tier, node))
            continue
        with graph.inserting_before(node):
            new = graph.call_function(bmm_op, (node.args[0], node.args[1], config))
        new.meta.update({key: v for key, v in node.meta.items() if key in ("val", "tensor_meta", "stack_trace",
                                                                           "nn_module_stack", "source_fn_stack")})
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        m_expr, m_hint = _m_expr_hint(m_int, rows)
        res.sites.append(GemmSite(sig, "bmm", op, dt, n, k, m_int, m_expr, m_hint, "none", False, config, tier,
                                  new.name))


# ------------------------------------------------------------------------------------------------ the pass

_SOURCES = (Path(__file__),)


def _source_hash() -> str:
    import importlib

    from ..families.gemm.ops import __file__ as lib_file
    from ..runtime import select

    # Everything that decides what the pass bakes: gemm and scaled_mm selection (the int8 heuristic lives in
    # scaled_mm.py) and the in-graph quantization rewrite.
    smm = importlib.import_module("oasr_ops.families.scaled_mm.ops")
    qpass = importlib.import_module("oasr_ops.inductor.quantize_pass")
    bmm = importlib.import_module("oasr_ops.families.bmm.ops")
    h = hashlib.sha256()
    for p in (*_SOURCES, Path(lib_file), Path(select.__file__), Path(smm.__file__), Path(qpass.__file__),
              Path(bmm.__file__)):
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(str(p).encode())
    return h.hexdigest()


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _Base
except ImportError:  # pragma: no cover - torch < 2.6
    _Base = object  # type: ignore[misc,assignment]


class OasrRewritePass(_Base):  # type: ignore[misc]
    """The `post_grad_custom_pre_pass` object. `uuid()` = pass sources + version + arch + DB selection hash."""

    def __init__(self, arch: str | None = None) -> None:
        self.arch = arch

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite_graph(graph, bake=True, arch=self.arch, log=True)

    def uuid(self) -> str:
        from .. import __version__
        from ..runtime import select
        from ..runtime.arch import current_arch_family, normalize_arch

        arch = normalize_arch(self.arch) if self.arch else current_arch_family()
        h = hashlib.sha256()
        for part in ("oasr-rewrite-v1", _source_hash(), __version__, arch or "none", select.selection_hash(arch)):
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
