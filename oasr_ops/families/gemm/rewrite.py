"""The gemm family's graph matcher: ATen Linear GEMMs (+ a fusable activation) -> `torch.ops.oasr.gemm`.

What it matches (functional, decomposed ATen, as the post-grad pre-pass sees it)::

    mm(a, permute(W, [1, 0]))            ->  oasr.gemm(a, W, None, act, cfg)
    addmm(bias, a, permute(W, [1, 0]))   ->  oasr.gemm(a, W, bias, act, cfg)

``t(W)`` / ``transpose(W, 0, 1)`` are accepted for the permute, and so is the constant that Inductor's freezing
folds the permute into (`graph.is_frozen_transposed_weight`; the rewrite reads it through a permute view); a 3-D
Linear input is already ``reshape`` + mm and keeps its reshapes. An activation directly after the GEMM (through
the 2-D -> 3-D reshape) is fused when the GEMM output has no other user: ``relu``, erf-``gelu`` and ``silu``,
either as their ATen ops or as the decompositions Inductor's table produces
(``convert(fp32) -> neg -> exp -> add 1 -> div -> convert`` for SiLU, ``0.5x * (1 + erf(x/sqrt 2))`` for GELU).
tanh-GELU is never fused (the kernels' GELU is the erf one).

What stays on aten (the reason is recorded in `RewriteResult.skipped`): a dtype other than fp16/bf16 (or mixed),
N or K not a multiple of 8 or not static, a weight that is not a transposed contiguous 2-D graph input/attribute
(a parameter: placeholder after AOTAutograd, get_attr under freezing) or autocast's fp16/bf16 cast of one, an
input not known to be contiguous, a bias that is not 1-D [N], addmm with alpha/beta != 1, a device other than
CPU/CUDA. Configs are baked by `oasr_ops.families.graph` (the contract is in its docstring).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..graph import (LOW_DTYPES, META_OPS, VIEW_OPS, RewriteContext, is_call, is_frozen_transposed_weight,
                     is_weight, keeps_aten, known_contiguous, operands_reason, replace_node, single_user, static_int,
                     untransposed, users, val)

aten = torch.ops.aten
prims = torch.ops.prims

FAMILY = "gemm"
PARAM_DERIVED = "oasr_param_derived"  # meta flag: a weight node computed from parameters only


# ------------------------------------------------------------------------------------------------ activation

def _scalar_is(x: Any, value: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(float(x) - value) < 1e-9


def _is_convert(node: Any, dtype: torch.dtype) -> bool:
    return is_call(node, prims.convert_element_type.default) and node.args[1] == dtype


def _other(node: torch.fx.Node, x: Any) -> Any:
    """The other argument of a binary op whose one argument is `x` (None when x is not an argument)."""
    a, b = node.args[0], node.args[1]
    if a is x:
        return b
    if b is x:
        return a
    return None


def _match_silu(c: torch.fx.Node, dtype: torch.dtype) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    us = users(c)
    if len(us) != 2:
        return None
    neg = next((u for u in us if is_call(u, aten.neg.default)), None)
    div = next((u for u in us if is_call(u, aten.div.Tensor)), None)
    if neg is None or div is None or div.args[0] is not c:
        return None
    exp = single_user(neg)
    if not is_call(exp, aten.exp.default):
        return None
    add = single_user(exp)
    if not is_call(add, aten.add.Tensor) or not _scalar_is(_other(add, exp), 1.0) or add.kwargs.get("alpha", 1) != 1:
        return None
    if single_user(add) is not div or div.args[1] is not add:
        return None
    end = single_user(div)
    if not _is_convert(end, dtype):
        return None
    return end, [end, div, add, exp, neg, c]


def _match_gelu(c: torch.fx.Node, dtype: torch.dtype) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    us = users(c)
    if len(us) != 2 or not all(is_call(u, aten.mul.Tensor) for u in us):
        return None
    half = next((u for u in us if _scalar_is(_other(u, c), 0.5)), None)
    scale = next((u for u in us if _scalar_is(_other(u, c), 0.7071067811865476)), None)
    if half is None or scale is None or half is scale:
        return None
    erf = single_user(scale)
    if not is_call(erf, aten.erf.default):
        return None
    add = single_user(erf)
    if not is_call(add, aten.add.Tensor) or not _scalar_is(_other(add, erf), 1.0) or add.kwargs.get("alpha", 1) != 1:
        return None
    mul = single_user(add)
    if not is_call(mul, aten.mul.Tensor) or single_user(half) is not mul or _other(mul, add) is not half:
        return None
    end = single_user(mul)
    if not _is_convert(end, dtype):
        return None
    return end, [end, mul, add, erf, scale, half, c]


def match_activation(x: torch.fx.Node, dtype: torch.dtype) -> tuple[str, torch.fx.Node, list[torch.fx.Node]] | None:
    """(activation, last node, chain nodes to erase) when `x`'s only consumer is a fusable activation."""
    u = single_user(x)
    if u is None:
        return None
    if is_call(u, aten.relu.default):
        return "relu", u, [u]
    if is_call(u, aten.silu.default):
        return "silu", u, [u]
    if is_call(u, aten.gelu.default) and u.kwargs.get("approximate", "none") == "none" and len(u.args) == 1:
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
    w: torch.fx.Node | None     # the weight source (placeholder / get_attr), [N, K]; None: `wt` is frozen
    wt: torch.fx.Node           # the permute node, or the frozen constant it was folded into
    bias: torch.fx.Node | None
    dtype: torch.dtype
    n: int
    k: int
    m: Any                      # int or SymInt


def _weight_source(node: Any) -> torch.fx.Node | None:
    """W when `node` is permute(W, [1, 0]) / t(W) / transpose(W, 0, 1) of a 2-D graph input or attribute."""
    if is_call(node, aten.permute.default):
        dims = [int(d) % 2 for d in node.args[1]]
        if dims != [1, 0]:
            return None
    elif is_call(node, aten.t.default):
        pass
    elif is_call(node, aten.transpose.int):
        if sorted(int(d) % 2 for d in node.args[1:3]) != [0, 1]:
            return None
    else:
        return None
    src = node.args[0]
    # A parameter (or autocast's fp16 / bf16 cast of one: an fp32 model under torch.autocast; the cast runs per
    # call with either backend), or a node another family's rewrite computed from parameters alone and marked so
    # (the conv2d_activation frontend's column-permuted Linear weight: constant under freezing).
    if not isinstance(src, torch.fx.Node) or not (is_weight(src) or src.meta.get(PARAM_DERIVED)):
        return None
    v = val(src)
    if not isinstance(v, torch.Tensor) or v.dim() != 2 or not known_contiguous(v):
        return None
    return src


def _candidate(node: torch.fx.Node) -> tuple[_Candidate | None, str]:
    if is_call(node, aten.mm.default):
        a, wt = node.args[0], node.args[1]
        bias = None
    else:  # addmm
        bias, a, wt = node.args[0], node.args[1], node.args[2]
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None, "addmm with alpha/beta != 1"
    frozen = is_frozen_transposed_weight(wt)
    w = None if frozen else _weight_source(wt)
    if w is None and not frozen:
        return None, "weight is not a transposed contiguous 2-D parameter"
    av, wv, ov = val(a), (val(wt).t() if frozen else val(w)), val(node)
    why = operands_reason((av, wv, ov), lambda: (wv.shape[0], wv.shape[1]))
    if why:
        return None, why
    n, k = static_int(wv.shape[0]), static_int(wv.shape[1])
    if av.dim() != 2 or not known_contiguous(av):
        return None, "input not known to be contiguous"
    if bias is not None:
        bv = val(bias)
        if not isinstance(bias, torch.fx.Node) or not isinstance(bv, torch.Tensor) or bv.dim() != 1 \
                or static_int(bv.shape[0]) != n or bv.dtype != av.dtype or not known_contiguous(bv):
            return None, "bias is not a contiguous 1-D [N] tensor of the input dtype"
    return _Candidate(node, a, w, wt, bias, av.dtype, n, k, av.shape[0]), ""


def _fuse_activation(graph: torch.fx.Graph, out: torch.fx.Node, end: torch.fx.Node,
                     chain: list[torch.fx.Node]) -> None:
    """The activation chain ending at `end` now runs inside the new oasr.gemm: `end`'s users read `out` (the
    reshape of its result, or the op itself) and the chain is erased."""
    end.replace_all_uses_with(out)
    for c in chain:  # last node first: each has no value users once its consumer is gone
        for u in list(c.users):  # shape queries: the chain is pointwise, `out` has the same shape
            if is_call(u, *META_OPS):
                u.replace_input_with(c, out)
        if not c.users:
            graph.erase_node(c)


def rewrite(ctx: RewriteContext) -> None:
    """Every eligible mm/addmm of `ctx.graph` -> `oasr.gemm` (the module docstring); the `rewrite` handler."""
    graph = ctx.graph
    gemm_op = torch.ops.oasr.gemm.default
    for node in list(graph.nodes):
        if not is_call(node, aten.mm.default, aten.addmm.default):
            continue
        cand, why = _candidate(node)
        if cand is None:
            ctx.skip(node, why)
            continue
        # The activation: directly after the GEMM, or after its single-user 2-D -> N-D reshape.
        out = node
        view = single_user(node)
        if view is not None and is_call(view, *VIEW_OPS):
            out = view
        act = match_activation(out, cand.dtype)
        activation, end, chain = ("none", None, []) if act is None else act
        if activation != "none" and single_user(node) is None:
            activation, end, chain = "none", None, []
        dt = LOW_DTYPES[cand.dtype]
        op = "gemm" if activation == "none" else "gemm_activation"
        config, tier, sig = ctx.choose(FAMILY, op, dt, cand.n, cand.k, static_int(cand.m))
        site = dict(config=config, tier=tier, activation=activation, bias=cand.bias is not None)
        if keeps_aten(config):
            ctx.record(sig, FAMILY, op, dt, cand.n, cand.k, cand.m, node=f"{node.name} (kept on aten)", **site)
            continue
        w = cand.w if cand.w is not None else untransposed(graph, cand.wt, node)
        new = replace_node(graph, node, gemm_op, (cand.a, w, cand.bias, activation, config))
        if end is not None:
            _fuse_activation(graph, out if out is not node else new, end, chain)
        if cand.w is not None and not cand.wt.users:
            graph.erase_node(cand.wt)
        ctx.record(sig, FAMILY, op, dt, cand.n, cand.k, cand.m, node=new.name, **site)
