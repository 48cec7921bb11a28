"""The conv1d family's graph-rewrite matcher: depthwise `aten.convolution` (+ inference BatchNorm + SiLU, + the
transposes around it) -> `torch.ops.oasr.conv1d_depthwise`.

Contract assumed (the generic machinery in families/graph.py will call it as a family's ``handlers["rewrite"]``;
the lead wires it):

* ``rewrite(graph, ctx)`` mutates `graph` in place and returns a `ConvRewriteResult` (sites rewritten, sites
  skipped with the reason). It never raises for an unmatched site: that site stays on aten.
* `graph` is a functional ATen FX graph (Inductor's post-grad pre-pass, or make_fx / AOT) whose nodes carry
  ``meta["val"]`` (fake tensors); a node without one is not matched.
* `ctx` is any object; read with defaults: ``ctx.bake`` (True: bake the tuning DB's config for a static B and T,
  else ``"auto"``), ``ctx.arch`` (arch family for selection; None: the current GPU's).

What matches::

    x_bct = permute(x_btc, [0, 2, 1]) | transpose(x_btc, 1, 2)        (optional: then layout "btc")
    x = glu(y, <channel dim>)                                          (optional: the op's GLU prologue reads y)
    y = convolution(x_bct, w [C, 1, Kw], b?, stride [1], padding [Kw // 2], dilation [1], transposed False,
                    output_padding [0], groups C)                     C = in = out channels, Kw odd 3..31
    y = getitem(_native_batch_norm_legit_no_training(y, gamma?, beta?, mean, var, momentum, eps), 0)  (optional;
        or native_batch_norm(y, gamma?, beta?, mean, var, False, momentum, eps), make_fx's undecomposed form;
        or its decomposition: a per-channel affine chain, affine.py)
    y = silu(y) | mul(y, sigmoid(y)) | cast(mul(z, sigmoid(z)), dtype), z = cast(y, fp32)   (optional)
    out = permute(y, [0, 2, 1]) | transpose(y, 1, 2)                  (optional, with layout "btc")
    out = silu(out) (its forms above)                                  (optional, when y had none)

x fp16/bf16 and 3-D; w (and b) a graph input or attribute (a parameter: placeholder after AOTAutograd, get_attr
under freezing); each intermediate has a single user. The BatchNorm is folded into fp32 weight and bias by
nodes inserted in the graph (`fold_batchnorm`'s formula), so the pass needs no parameter values; under freezing
Inductor constant-folds them. With a transposed [B, T, C] input the op reads it directly (layout btc); its output
is [B, T, C] too, which replaces a transpose back to [B, T, C] or, without one, is viewed as [B, C, T] again (a
permute, no copy). Anything else is recorded in ``skipped`` and left alone (e.g. a regular or strided conv).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from ...configs import DW_MAX_KW
from ..graph import is_weight
from . import affine as _affine
from .ops import DTYPES, select_config, signature

aten = torch.ops.aten
prims = torch.ops.prims
_META_OPS = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}


@dataclass
class ConvSite:
    """One rewritten depthwise conv."""

    signature: str
    layout: str
    activation: str
    batch_norm: bool
    channels: int
    kernel_width: int
    config: str
    node: str
    dtype: str = ""
    rows: Any = None  # M = B * T (int or SymInt): the DB's M axis for conv1d regions
    tier: str = ""  # the tier that answered the baked config ("" when not baked)
    glu: bool = False  # the GLU before the conv runs in the op's prologue


@dataclass
class ConvRewriteResult:
    sites: list[ConvSite] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (node name, reason)


def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _users(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [u for u in node.users if not _is(u, *_META_OPS)]


def _single_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = _users(node)
    return users[0] if len(users) == 1 else None


def _static(x: Any) -> int | None:
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt) and getattr(x.node.expr, "is_number", False):
        return int(x.node.expr)
    return None


def _is_swap_12(node: Any) -> bool:
    """permute(t, [0, 2, 1]) or transpose(t, 1, 2) of a 3-D tensor."""
    if _is(node, aten.permute.default):
        return [int(d) % 3 for d in node.args[1]] == [0, 2, 1]
    if _is(node, aten.transpose.int):
        return sorted(int(d) % 3 for d in node.args[1:3]) == [1, 2]
    return False


def is_pointwise(conv: torch.fx.Node) -> bool:
    """True when `conv` is a 1-D convolution with a kernel of 1 and one group (pointwise.py's sites)."""
    wv = _val(conv.args[1]) if len(conv.args) > 1 else None
    groups = conv.args[8] if len(conv.args) > 8 else None
    return isinstance(wv, torch.Tensor) and wv.dim() == 3 and _static(wv.shape[2]) == 1 and _static(groups) == 1


def _list_is(x: Any, value: int) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == 1 and _static(x[0]) == value


def _conv_reason(node: torch.fx.Node) -> str | None:
    """None when `node` is a depthwise conv this op serves, else why not."""
    args = list(node.args) + [None] * (9 - len(node.args))
    x, w, b, stride, padding, dilation, transposed, out_pad, groups = args[:9]
    xv, wv = _val(x), _val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor):
        return "no tensor metadata"
    if xv.dim() != 3:
        return f"not a 1-D conv (input is {xv.dim()}-D)"
    if xv.dtype not in DTYPES or wv.dtype != xv.dtype:
        return f"dtype {xv.dtype} / weight {wv.dtype} (fp16/bf16 only)"
    if wv.dim() != 3 or any(_static(s) is None for s in wv.shape):
        return f"weight {tuple(wv.shape)} is not a static [C, 1, Kw]"
    c, kw = _static(wv.shape[0]), _static(wv.shape[2])
    if _static(wv.shape[1]) != 1 or _static(groups) != c or _static(xv.shape[1]) != c:
        return f"not depthwise (groups {groups}, in channels {xv.shape[1]}, weight {tuple(wv.shape)})"
    if kw % 2 == 0 or not (3 <= kw <= DW_MAX_KW):
        return f"kernel width {kw} is not odd in 3..{DW_MAX_KW}"
    if transposed or not _list_is(stride, 1) or not _list_is(dilation, 1) or not _list_is(padding, kw // 2) \
            or not (out_pad is None or all(_static(p) == 0 for p in out_pad)):
        return f"not stride 1 / dilation 1 / 'same' padding {kw // 2} (stride {stride}, padding {padding}, " \
               f"dilation {dilation}, transposed {transposed})"
    if not is_weight(w):
        return "weight is not a parameter (graph input or attribute, or autocast's cast of one)"
    if b is not None and not is_weight(b):
        return "bias is not a parameter (graph input or attribute)"
    return None


def _batch_norm_after(y: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(bn node, its getitem 0) when `y`'s only user is an inference BatchNorm whose only used output is 0."""
    bn = _single_user(y)
    if _is(bn, aten.native_batch_norm.default):  # make_fx without decompositions: (.., training, ..)
        if bn.args[5] is not False:
            return None
    elif not _is(bn, aten._native_batch_norm_legit_no_training.default):
        return None
    if bn.args[0] is not y or bn.args[3] is None or bn.args[4] is None:
        return None
    users = _users(bn)
    if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
        return None
    first = [u for u in users if u.args[1] == 0]
    if len(first) != 1 or any(_users(u) for u in users if u.args[1] != 0):
        return None  # the batch statistics outputs are used: not a plain inference BatchNorm
    return bn, first[0]


def _is_cast(node: Any, dtype: torch.dtype) -> bool:
    if _is(node, prims.convert_element_type.default):
        return node.args[1] == dtype
    return _is(node, aten._to_copy.default) and node.kwargs.get("dtype") == dtype and len(node.args) == 1 \
        and set(node.kwargs) <= {"dtype"}


def _sigmoid_mul(z: torch.fx.Node, zu: list[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """[sigmoid, mul] of mul(z, sigmoid(z)); None otherwise."""
    sig = next((u for u in zu if _is(u, aten.sigmoid.default)), None)
    mul = next((u for u in zu if _is(u, aten.mul.Tensor)), None)
    if sig is None or mul is None or set(mul.args[:2]) != {z, sig} or _users(sig) != [mul]:
        return None
    return [sig, mul]


def _exp_div(z: torch.fx.Node, zu: list[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """[neg, exp, add, div] of div(z, add(exp(neg(z)), 1)) (Inductor's SiLU decomposition); None otherwise."""
    neg = next((u for u in zu if _is(u, aten.neg.default)), None)
    div = next((u for u in zu if _is(u, aten.div.Tensor)), None)
    if neg is None or div is None or div.args[0] is not z:
        return None
    exp = _single_user(neg)
    add = _single_user(exp) if _is(exp, aten.exp.default) else None
    if not _is(add, aten.add.Tensor) or exp not in add.args[:2] or add.kwargs.get("alpha", 1) != 1:
        return None
    one = add.args[1] if add.args[0] is exp else add.args[0]
    if not isinstance(one, (int, float)) or float(one) != 1.0 or _single_user(add) is not div or div.args[1] is not add:
        return None
    return [neg, exp, add, div]


def _silu_after(y: torch.fx.Node, dtype: torch.dtype) -> list[torch.fx.Node] | None:
    """The nodes of silu(y), last one last; None if y's use is not one. Forms: aten.silu; mul(y, sigmoid(y));
    the decompositions cast(mul(z, sigmoid(z)), dtype) and cast(div(z, 1 + exp(-z)), dtype) with z = cast(y, fp32)
    (what the kernel computes)."""
    users = _users(y)
    if len(users) == 1 and _is(users[0], aten.silu.default):
        return [users[0]]
    nodes: list[torch.fx.Node] = []
    z = y
    if len(users) == 1 and _is_cast(users[0], torch.float32) and dtype != torch.float32:
        z = users[0]
        nodes.append(z)
    zu = _users(z)
    if len(zu) != 2:
        return None
    core = _sigmoid_mul(z, zu) or _exp_div(z, zu)
    if core is None:
        return None
    nodes += core
    mul = core[-1]
    if z is not y:  # upcast: the silu ends with the cast back
        down = _single_user(mul)
        if not _is_cast(down, dtype):
            return None
        nodes.append(down)
    return nodes


class _Builder:
    """Inserts ATen nodes before `anchor`, each with a fake-tensor ``meta["val"]`` computed from its inputs."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node) -> None:
        self.graph, self.anchor = graph, anchor

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        vals = [(_val(a) if isinstance(a, torch.fx.Node) else a) for a in args]
        if not any(isinstance(a, torch.fx.Node) and _val(a) is None for a in args):
            try:
                node.meta["val"] = target(*vals, **kwargs)
            except Exception:  # metadata is a convenience for later passes; the values are what matter
                pass
        return node

    def f32(self, node: torch.fx.Node) -> torch.fx.Node:
        return self(prims.convert_element_type.default, node, torch.float32)


def _fold(bld: _Builder, w: torch.fx.Node, b: torch.fx.Node | None, bn: torch.fx.Node | None, c: int
          ) -> tuple[torch.fx.Node, torch.fx.Node | None]:
    """fp32 (w', b'): `ops.fold_batchnorm`'s formula as graph nodes (just w, b in fp32 without a BatchNorm)."""
    w32 = bld.f32(w)
    b32 = bld.f32(b) if b is not None else None
    if bn is None:
        return w32, b32
    gamma, beta, mean, var = bn.args[1:5]
    eps = bn.args[-1]  # last in both spellings (module docstring)
    g = bld(aten.rsqrt.default, bld(aten.add.Tensor, bld.f32(var), float(eps)))
    if gamma is not None:
        g = bld(aten.mul.Tensor, g, bld.f32(gamma))
    w2 = bld(aten.mul.Tensor, w32, bld(aten.view.default, g, [c, 1, 1]))
    shifted = bld(aten.neg.default, bld.f32(mean)) if b32 is None else bld(aten.sub.Tensor, b32, bld.f32(mean))
    b2 = bld(aten.mul.Tensor, shifted, g)
    if beta is not None:
        b2 = bld(aten.add.Tensor, b2, bld.f32(beta))
    return w2, b2


def _erase(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Erase a node nothing reads any more, with its unused getitem / shape-query users."""
    for u in list(node.users):
        if not u.users and (_is(u, *_META_OPS) or u.target is operator.getitem):
            graph.erase_node(u)
    if not node.users:
        graph.erase_node(node)


def _glu_source(src: Any, layout: str) -> torch.fx.Node | None:
    """y when `src` is ``glu(y, <channel dim of layout>)`` with no other user (its value is never needed)."""
    if not _is(src, aten.glu.default) or len(_users(src)) != 1:
        return None
    dim = src.args[1] if len(src.args) > 1 else src.kwargs.get("dim", -1)
    y = src.args[0]
    yv = _val(y)
    if not isinstance(yv, torch.Tensor) or yv.dim() != 3 or int(dim) % 3 != (1 if layout == "bct" else 2):
        return None
    return y


def _config(ctx: Any, dtype: torch.dtype, layout: str, c: int, kw: int, xv: torch.Tensor) -> tuple[str, str]:
    """(config, tier) to bake; ("auto", "") when not baking or B x T is symbolic (resolved per call)."""
    if not getattr(ctx, "bake", True):
        return "auto", ""
    bsz = _static(xv.shape[0])
    t = _static(xv.shape[2] if layout == "bct" else xv.shape[1])
    if bsz is None or t is None:
        return "auto", ""  # resolved per call (exact points need the concrete B x T)
    try:
        sel = select_config(dtype, layout, c, kw, bsz, t, getattr(ctx, "arch", None))
    except Exception:  # no GPU and no OASR_ARCH: the op resolves at run time
        return "auto", ""
    return sel.config, sel.tier


def rewrite(graph: torch.fx.Graph, ctx: Any = None) -> ConvRewriteResult:
    """Rewrite every matching depthwise conv site of `graph` in place (module docstring)."""
    res = ConvRewriteResult()
    for conv in list(graph.nodes):
        if not _is(conv, aten.convolution.default) or is_pointwise(conv):
            continue  # pointwise convs: pointwise.py records them
        why = _conv_reason(conv)
        if why is not None:
            res.skipped.append((conv.name, why))
            continue
        x, w, b = conv.args[0], conv.args[1], conv.args[2]
        xv, wv = _val(x), _val(conv.args[1])
        c, kw = int(wv.shape[0]), int(wv.shape[2])
        chain: list[torch.fx.Node] = [conv]
        tail = conv
        bn_pair = _batch_norm_after(tail)
        bn, aff = None, None
        if bn_pair is not None:
            bn, tail = bn_pair
            chain += [bn, tail]
        else:  # the BatchNorm's decomposition (or any per-channel affine map) after the conv
            aff = _affine.match(tail, xv.dtype, c, {x, *x.all_input_nodes})
            if aff is not None:
                tail = aff.nodes[-1]
                chain += aff.nodes
        activation = "none"
        silu = _silu_after(tail, xv.dtype)
        if aff is not None and aff.ends_in_fp32 and (silu is None or not _is_cast(silu[-1], xv.dtype)):
            # an fp32 affine result read by something else: folding it would change that consumer's dtype
            aff, tail, chain = None, conv, [conv]
            silu = _silu_after(tail, xv.dtype)
        if silu is not None:
            activation, tail = "silu", silu[-1]
            chain += silu
        layout, src = "bct", x
        if _is_swap_12(x) and isinstance(_val(x.args[0]), torch.Tensor):
            layout, src = "btc", x.args[0]
        glu_node, glu_src = src, _glu_source(src, layout)
        if glu_src is not None:  # F.glu over the channels feeds the conv: the op computes it on load
            src = glu_src
        back = _single_user(tail)
        transposed_back = layout == "btc" and _is_swap_12(back)
        after: list[torch.fx.Node] = []  # a SiLU after the transpose back (the Linear form: silu(bn(y).mT))
        if transposed_back and activation == "none":
            after = _silu_after(back, xv.dtype) or []
            activation = "silu" if after else activation
        config, tier = _config(ctx, xv.dtype, layout, c, kw, _val(src))

        bld = _Builder(graph, tail)  # before the chain's end: the affine chain's vectors are defined after the conv
        if aff is not None:
            w2, b2 = _affine.fold(bld, bld.f32(w), None if b is None else bld.f32(b), aff, c)
        else:
            w2, b2 = _fold(bld, w, b, bn, c)
        op = bld(torch.ops.oasr.conv1d_depthwise.default, src, w2, b2, kw // 2, layout, activation, config,
                 glu_src is not None)
        if layout == "btc" and not transposed_back:
            out = bld(aten.permute.default, op, [0, 2, 1])  # a [B, C, T] view for consumers that expect one
        else:
            out = op
        replaced = after[-1] if after else (back if transposed_back else tail)
        replaced.replace_all_uses_with(out)
        for node in reversed(chain + ([back] if transposed_back else []) + after):
            _erase(graph, node)
        if layout == "btc":
            _erase(graph, x)
        if glu_src is not None:
            _erase(graph, glu_node)
        sv = _val(src)
        rows = sv.shape[0] * (sv.shape[2] if layout == "bct" else sv.shape[1])
        res.sites.append(ConvSite(signature(layout, c, kw), layout, activation, bn is not None or aff is not None,
                                  c, kw, config,
                                  conv.name, DTYPES.get(xv.dtype, str(xv.dtype)), rows, tier, glu_src is not None))
    return res
