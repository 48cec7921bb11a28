"""The family-generic half of the graph rewrite: FX helpers, the site record, config baking, and
`rewrite_graph`, which hands the graph to every registered family's matcher in ``rewrite_order``, then
registration order.

Runs inside Inductor's `post_grad_custom_pre_pass` (`oasr_ops.inductor.rewrite.OasrRewritePass`) and, with
``bake=False``, inside the traced census (`oasr_ops.tune.census`), so the census sees exactly the sites the
backend rewrites. Nothing here names a family: each family's matcher lives in ``families/<name>/rewrite.py``.

Handler contracts (``FamilySpec.handlers``):

``handlers["rewrite"]``: ``fn(ctx: RewriteContext) -> None``
    Walk ``ctx.graph`` (functional, decomposed ATen as the post-grad pre-pass sees it), replace the family's
    eligible nodes in place by its ``torch.ops.oasr.*`` op with ``ctx.choose(...)``'s config, and report every
    site: ``ctx.record(...)`` for a site (rewritten, kept on aten because the baked answer is cuBLAS — see
    `keeps_aten` — or an existing oasr op whose config was baked), ``ctx.skip(node, reason)`` for a node that
    stays on aten because the kernels cannot serve it. It must not select anything when ``ctx.bake`` is False
    (the census: ``config="auto"``); `RewriteContext.choose` already honours that.

``handlers["census"]`` (optional): ``fn(site: GemmSite) -> list[CensusPoint]``
    The census points one recorded site contributes (one per GEMM call the site makes). The default,
    `default_census_points`, is one point ``(signature with dt=half, family, op, dtype, n, k, m)`` where ``m``
    is the static M or, for a symbolic M, its sympy expression in the trace's symbols (the census substitutes
    each graph key into it). A family whose point needs another form returns its own points; one that is not
    censused returns ``[]`` (the census counts those sites under ``not_censused``).

Configs: a static M bakes ``select_config(...).config`` (a concrete id or a sentinel); a symbolic M bakes the
signature's region table (``format_table(select.region_table(...))``), resolved per call. A graph compiled to run
without CUDA graphs (``eager``) bakes from the entries' ``regions_eager`` where they have them. A table whose answer
depends on M beyond the DB (a cost model or registered heuristic: ``auto`` rows) is baked as ``auto`` except for
a trailing ``auto`` row, which the ops already treat as "past the end -> auto".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..runtime import registry

aten = torch.ops.aten
prims = torch.ops.prims

LOW_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
VIEW_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
META_OPS = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}
ALIGN = 8
_COPIED_META = ("val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack")

# A site whose baked answer is cuBLAS for every M keeps its aten node: `oasr.gemm(..., "torch")` would run the same
# cuBLAS call but pin the operands' strides (`needs_fixed_stride_order`) and hide the epilogue from Inductor's
# fusion — measured slower end to end than leaving the node alone (docs/perf/e2e.md). The site is still recorded
# (tuning report, census); a DB change recompiles (the pass's uuid covers the DB), so a later entry takes effect.
ATEN_CONFIGS = frozenset({"torch", "regions:*=torch"})


# ------------------------------------------------------------------------------------------------ records

@dataclass
class GemmSite:
    """One rewritten (or, in the census, would-be rewritten) GEMM-like site of any family."""

    signature: str          # the DB signature (dtype-specific spelling, as select_config returns it)
    family: str
    op: str                 # the DB op, e.g. gemm | gemm_activation | scaled_mm | bmm_nn
    dtype: str              # fp16 | bf16 | int8
    n: int
    k: int
    m: int | None           # None when symbolic (a region table was baked)
    m_expr: Any = None      # the sympy expression of a symbolic M (census substitutes keys into it)
    m_hint: int | None = None  # M of the example inputs (a symbolic M's hint), when known
    activation: str = "none"
    bias: bool = False
    config: str = "auto"    # what was baked into the graph
    tier: str = ""          # the tier that answered (static M), or a baked table's (select.table_tier)
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
    source: str = "pass"  # pass: the backend's pass rewrote the graph; cache: re-derived for an FX/AOT cache hit


@dataclass(frozen=True)
class CensusPoint:
    """One census point of a site: M is an int or a sympy expression of the trace's symbols."""

    signature: str          # dt=half spelling (the DB's family-wide signature)
    family: str
    op: str
    dtype: str
    n: int
    k: int
    m: Any


# ------------------------------------------------------------------------------------------------ FX helpers

def is_call(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def is_param(node: Any) -> bool:
    """True for a graph input or attribute (a parameter or buffer of the compiled module, in the post-grad graph)."""
    return isinstance(node, torch.fx.Node) and node.op in ("placeholder", "get_attr")


def is_weight(node: Any) -> bool:
    """True for a parameter (`is_param`) or autocast's fp16 / bf16 cast of one (`prims.convert_element_type` of a
    graph input or attribute: what an fp32 model under torch.autocast puts before each GEMM and conv). Either is the
    same value on every call: the rewrites that require a parameter weight (its transforms run per call, or fold
    into constants under freezing) take both."""
    if is_param(node):
        return True
    return (is_call(node, torch.ops.prims.convert_element_type.default) and node.args[1] in LOW_DTYPES
            and is_param(node.args[0]))


def val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def static_int(x: Any) -> int | None:
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        e = x.node.expr
        if getattr(e, "is_number", False):
            return int(e)
    return None


def known_contiguous(t: torch.Tensor) -> bool:
    try:
        from torch._prims_common import is_contiguous_or_false
        return bool(is_contiguous_or_false(t))
    except ImportError:  # older torch: is_contiguous may guard on a symbolic shape; that is fine there
        try:
            return bool(t.is_contiguous())
        except Exception:
            return False


def is_frozen_transposed_weight(node: Any) -> bool:
    """True for a graph constant that is the transpose of a contiguous 2-D tensor: what a Linear's
    ``permute(W, [1, 0])`` becomes under Inductor's freezing, whose constant folding runs before the post-grad
    passes and turns the permute into a ``get_attr`` of the view (shape [K, N], strides (1, K)). Matchers take it
    as the transposed weight and read its contiguous [N, K] form through `untransposed`."""
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return False
    v = val(node)
    return isinstance(v, torch.Tensor) and v.dim() == 2 and known_contiguous(v.t())


def untransposed(graph: torch.fx.Graph, wt: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
    """``permute(wt, [1, 0])`` inserted before `before`: the contiguous [N, K] view of a frozen transposed weight
    (`is_frozen_transposed_weight`); Inductor lowers a permute of a constant to a view, no copy."""
    with graph.inserting_before(before):
        w = graph.call_function(torch.ops.aten.permute.default, (wt, [1, 0]))
    w.meta["val"] = val(wt).permute(1, 0)
    return w


def users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Users that read values (shape queries such as `sym_size` of a symbolic trace do not count)."""
    return [u for u in node.users if not is_call(u, *META_OPS)]


def single_user(node: torch.fx.Node) -> torch.fx.Node | None:
    us = users(node)
    return us[0] if len(us) == 1 else None


def operands_reason(vals: tuple, n_k: Callable[[], tuple[Any, Any]]) -> str | None:
    """Why fake values `vals` (the first is a) and the GEMM's (N, K) = `n_k()` keep an fp16/bf16 site on aten,
    or None."""
    if not all(isinstance(t, torch.Tensor) for t in vals):
        return "no fake value"
    av = vals[0]
    if av.dtype not in LOW_DTYPES or any(t.dtype != av.dtype for t in vals):
        return f"dtype {av.dtype}/{vals[1].dtype} (fp16/bf16 only)"
    if av.device.type not in ("cpu", "cuda", "meta"):
        return f"device {av.device}"
    n, k = (static_int(x) for x in n_k())
    if n is None or k is None:
        return "symbolic N or K"
    if n <= 0 or k <= 0:  # an empty attention (T = 0) or a zero-width weight: nothing to tune, aten handles it
        return f"N={n} K={k}: empty"
    if n % ALIGN or k % ALIGN:
        return f"N={n} K={k} not multiples of {ALIGN}"
    return None


def m_expr_hint(m_int: int | None, m: Any) -> tuple[Any, int | None]:
    """(sympy expression, hint) of a symbolic M; (None, M) for a static one."""
    if m_int is not None or not isinstance(m, torch.SymInt):
        return None, m_int
    try:
        hint = int(m.node.hint) if m.node.hint is not None else None
    except Exception:
        hint = None
    return m.node.expr, hint


def keeps_aten(config: str) -> bool:
    """True when a baked answer is cuBLAS for every M: the site keeps its aten node (see `ATEN_CONFIGS`)."""
    return config in ATEN_CONFIGS


def replace_node(graph: torch.fx.Graph, node: torch.fx.Node, target: Any, args: tuple) -> torch.fx.Node:
    """Insert ``target(*args)`` before `node` with its metadata, move `node`'s users to it, erase `node`."""
    with graph.inserting_before(node):
        new = graph.call_function(target, args)
    new.meta.update({k: v for k, v in node.meta.items() if k in _COPIED_META})
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


# ------------------------------------------------------------------------------------------------ baking

def signature(family: str, op: str, dtype: str, n: int, k: int) -> str:
    from ..runtime import database

    return database.signature(family, op, dtype, n, k)


def bake(family: str, op: str, dtype: str, n: int, k: int, m: int | None, arch: str | None,
         eager: bool = False) -> tuple[str, str, str]:
    """(config string, tier, signature) to put into the graph for M = `m` (None: symbolic, a region table).
    ``eager``: the graph runs without CUDA graphs, so the DB's ``regions_eager`` answer where an entry has them
    (tune/serving_regions.py); an autotune() result still comes first."""
    from ..runtime import select
    from ..runtime.plans import format_table

    sig = signature(family, op, dtype, n, k)
    if m is not None:
        s = select.select_config(family, op, dtype, n, k, m, arch)
        if eager and s.tier != "autotune":
            hit = select.eager_answer(family, op, dtype, n, k, m, arch)
            if hit is not None:
                return hit[0], hit[1], sig
        return s.config, s.tier, sig
    table = select.region_table(family, op, dtype, n, k, arch, eager=eager)
    tier = select.table_tier(family, op, dtype, n, k, arch)
    if table and table[-1][1] == "auto":
        table = table[:-1]
    if not table or any(cfg == "auto" for _, cfg in table):
        return "auto", tier, sig
    return format_table([(hi, cfg) for hi, cfg in table]), tier, sig


@dataclass
class RewriteContext:
    """What a family's matcher gets: the graph, where to record, and whether (and for which arch) to bake."""

    graph: torch.fx.Graph
    result: RewriteResult
    bake: bool = True
    arch: str | None = None
    eager: bool = False  # the graph runs without CUDA graphs (`bake`)

    def choose(self, family: str, op: str, dtype: str, n: int, k: int, m: int | None) -> tuple[str, str, str]:
        """(config, tier, signature): the baked answer, or ``("auto", "", signature)`` when not baking."""
        if self.bake:
            return bake(family, op, dtype, n, k, m, self.arch, self.eager)
        return "auto", "", signature(family, op, dtype, n, k)

    def skip(self, node: torch.fx.Node, reason: str) -> None:
        self.result.skipped.append((node.name, reason))

    def record(self, sig: str, family: str, op: str, dtype: str, n: int, k: int, m: Any, *, config: str,
               tier: str, node: str, activation: str = "none", bias: bool = False) -> GemmSite:
        """Record one site; `m` is the traced M (int or SymInt)."""
        m_int = static_int(m)
        m_expr, m_hint = m_expr_hint(m_int, m)
        site = GemmSite(sig, family, op, dtype, n, k, m_int, m_expr, m_hint, activation, bias, config, tier, node)
        self.result.sites.append(site)
        return site


def rewrite_graph(graph: torch.fx.Graph, *, bake: bool = True, arch: str | None = None,
                  eager: bool = False) -> RewriteResult:
    """Hand `graph` to every registered family's ``rewrite`` matcher (registration order); returns what they did.

    ``bake=False`` (the census) inserts ``config="auto"`` and resolves nothing. ``eager``: the graph will run
    without CUDA graphs (`bake`).
    """
    res = RewriteResult()
    if bake:
        from ..runtime import database

        res.epoch = database.epoch()
    ctx = RewriteContext(graph, res, bake, arch, eager)
    for spec in sorted(registry.families().values(), key=lambda f: f.rewrite_order):  # stable: registration order
        matcher = spec.handler("rewrite")
        if matcher is not None:
            matcher(ctx)
    return res


# ------------------------------------------------------------------------------------------------ census

def default_census_points(site: GemmSite) -> list[CensusPoint]:
    """One point per site: the DB's family-wide signature (dt=half spelling), M static or its expression."""
    m = site.m if site.m is not None else site.m_expr
    return [CensusPoint(signature(site.family, site.op, "half", site.n, site.k), site.family, site.op,
                        site.dtype, site.n, site.k, m)]


def census_points(site: GemmSite) -> list[CensusPoint]:
    """The census points of a recorded site: the family's ``census`` handler, else `default_census_points`."""
    spec = registry.families().get(site.family)
    recorder = spec.handler("census") if spec is not None else None
    return list((recorder or default_census_points)(site))
