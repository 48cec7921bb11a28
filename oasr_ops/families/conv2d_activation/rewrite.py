"""The conv2d_activation family's graph matcher: 2-D `aten.convolution` (+ a following activation) ->
`torch.ops.oasr.conv2d_activation` in NHWC, and the Conv2dSubsampling flatten + Linear made copy-free.

What matches (functional ATen as the post-grad pre-pass sees it)::

    y = convolution(x [B, Cin, H, W], w [Cout, Cin, KH, KW] (a parameter), b? (a parameter), stride [sh, sw],
                    padding [ph, pw], dilation [1, 1], transposed False, output_padding [0, 0], groups 1)
    y = relu(y) | clamp_min(y, 0) | silu(y) | gelu(y) (erf)                            (optional, fused)

x fp16/bf16, 4-D, with a NHWC source the op reads without a copy: either x = permute(x_nhwc, [0, 3, 1, 2]) (the
NCHW view this rewrite leaves after an earlier conv2d op) or Cin = 1 (``feats.unsqueeze(1)``: NCHW and NHWC are
the same memory then). The weight becomes KRSC (``permute(w, [0, 2, 3, 1])``, a copy node for Cin > 1 that
Inductor computes from the parameter, constant-folded under freezing). The op's NHWC output replaces the chain's
last node through the NCHW view ``permute(y_nhwc, [0, 3, 1, 2])``, so every consumer still sees [B, C, H, W].
Anything else stays on aten with its reason recorded (an NCHW input with Cin > 1 would need a layout copy first;
grouped, dilated or transposed convs; non-parameter weights; other dtypes).

The frontend's flatten (``x.transpose(1, 2).reshape(b, t, c * f)`` -> Linear), after a rewritten conv::

    permute(view, [0, 2, 1, 3]) -> clone -> reshape [B, T, C * F] -> reshape* -> mm/addmm(.., permute(W, [1, 0]))

becomes ``reshape(y_nhwc, [B, T, F * C])`` (free: y_nhwc is packed [B, T, F, C]) with the Linear's weight columns
permuted from (c, f) to (f, c) order: ``W'[:, f * C + c] = W[:, c * F + f]``. Exact: every output is the same dot
product ``sum_{c,f} W[n, c F + f] x[c, f]`` over the same pairs, only visited in another order — a reordering of
the fp32 accumulation that any GEMM tiling already chooses freely. Done only when every consumer of the
flattened tensor is such a Linear (through reshapes that keep the last dim); otherwise the clone stays. The
permuted weight is a graph node computed from the parameter (a d x C x F copy per call unless frozen, where
Inductor constant-folds it), marked ``meta["oasr_param_derived"]`` so the gemm matcher still serves the Linear.
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import (LOW_DTYPES, META_OPS, RewriteContext, is_call, is_frozen_transposed_weight, is_weight,
                     known_contiguous, single_user, static_int, untransposed, users, val)
from ..gemm.rewrite import PARAM_DERIVED
from .ops import ACTIVATIONS, FAMILY, db_op, out_extent, signature

aten = torch.ops.aten

_RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _ints(x: Any, n: int) -> tuple[int, ...] | None:
    if not isinstance(x, (list, tuple)) or len(x) != n:
        return None
    v = tuple(static_int(i) for i in x)
    return None if any(i is None for i in v) else v


def _is_permute(node: Any, dims: list[int]) -> bool:
    """permute(t, dims), or the transpose(t, i, j) / t(t) that is the same swap of two dims."""
    if is_call(node, aten.permute.default):
        return [int(d) % len(dims) for d in node.args[1]] == dims
    swapped = [i for i, d in enumerate(dims) if d != i]
    if len(swapped) != 2 or dims[swapped[0]] != swapped[1]:
        return False
    if is_call(node, aten.transpose.int):
        v = val(node.args[0])
        nd = v.dim() if isinstance(v, torch.Tensor) else len(dims)
        return nd == len(dims) and sorted(int(d) % nd for d in node.args[1:3]) == swapped
    return is_call(node, aten.t.default) and dims == [1, 0]


def conv_reason(node: torch.fx.Node) -> str | None:
    """None when `node` is a 2-D conv this family serves (its input layout aside), else why not."""
    args = list(node.args) + [None] * (9 - len(node.args))
    x, w, b, stride, padding, dilation, transposed, out_pad, groups = args[:9]
    xv, wv = val(x), val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor):
        return "no tensor metadata"
    if xv.dim() != 4:
        return f"not a 2-D conv (input is {xv.dim()}-D)"
    if xv.dtype not in LOW_DTYPES or wv.dtype != xv.dtype:
        return f"dtype {xv.dtype} / weight {wv.dtype} (fp16/bf16 only)"
    if _ints(list(wv.shape), 4) is None:
        return f"weight {tuple(wv.shape)} is not static"
    if transposed:
        return "transposed conv"
    if static_int(groups) != 1:
        return f"grouped conv (groups {groups})"
    if _ints(stride, 2) is None or _ints(padding, 2) is None:
        return f"stride {stride} / padding {padding} not two static ints"
    if _ints(dilation, 2) != (1, 1):
        return f"dilation {dilation}"
    if out_pad is not None and any(static_int(p) != 0 for p in out_pad):
        return f"output padding {out_pad}"
    if static_int(xv.shape[1]) != static_int(wv.shape[1]):
        return f"input channels {xv.shape[1]} vs weight {tuple(wv.shape)}"
    if not is_weight(w):
        return "weight is not a parameter (graph input or attribute, or autocast's cast of one)"
    if b is not None and not is_weight(b):
        return "bias is not a parameter (graph input or attribute)"
    return None


def _activation_after(y: torch.fx.Node) -> tuple[str, torch.fx.Node | None]:
    """(activation, its node) when `y`'s only user is a fusable activation, else ("none", None)."""
    u = single_user(y)
    if u is None or u.args[0] is not y:
        return "none", None
    if is_call(u, aten.relu.default):
        return "relu", u
    if is_call(u, aten.clamp_min.default) and isinstance(u.args[1], (int, float)) and float(u.args[1]) == 0.0:
        return "relu", u
    if is_call(u, aten.silu.default):
        return "silu", u
    if is_call(u, aten.gelu.default) and u.kwargs.get("approximate", "none") == "none" and len(u.args) == 1:
        return "gelu", u
    return "none", None


def _nhwc_source(x: torch.fx.Node, xv: torch.Tensor) -> tuple[str, Any]:
    """("view", x_nhwc) when x is our NCHW view of an NHWC tensor, ("c1", x) when Cin = 1, else (reason, None)."""
    if _is_permute(x, [0, 3, 1, 2]):
        return "view", x.args[0]
    if static_int(xv.shape[1]) == 1:
        return "c1", x
    return f"input is an NCHW tensor with {xv.shape[1]} channels (an NHWC copy first would cost what cuDNN's " \
           "layout conversion does)", None


class _Insert:
    """Inserts nodes before `anchor`, each with a fake ``meta["val"]`` computed from its inputs."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node) -> None:
        self.graph, self.anchor = graph, anchor

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        vals = [(val(a) if isinstance(a, torch.fx.Node) else a) for a in args]
        try:
            node.meta["val"] = target(*vals, **kwargs)
        except Exception:  # metadata helps later passes; the values are what matter
            pass
        return node


def _erase_unused(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    for node in nodes:
        for u in list(node.users):
            if is_call(u, *META_OPS) and not u.users:
                graph.erase_node(u)
        if not node.users:
            graph.erase_node(node)


def _rewrite_conv(ctx: RewriteContext, conv: torch.fx.Node) -> torch.fx.Node | None:
    """One conv site -> the op; returns the op node (None: skipped, reason recorded)."""
    why = conv_reason(conv)
    xv = val(conv.args[0])
    if why is None:
        kind, src = _nhwc_source(conv.args[0], xv)
        if src is None:
            why = kind
    if why is not None:
        ctx.skip(conv, why)
        return None
    graph = ctx.graph
    x, w, b = conv.args[0], conv.args[1], conv.args[2] if len(conv.args) > 2 else None
    wv = val(w)
    cout, cin, kh, kw = (int(s) for s in wv.shape)
    stride, padding = list(_ints(conv.args[3], 2)), list(_ints(conv.args[4], 2))
    activation, act_node = _activation_after(conv)
    tail = act_node if act_node is not None else conv
    ho = out_extent(xv.shape[2], kh, stride[0], padding[0])
    wo = out_extent(xv.shape[3], kw, stride[1], padding[1])
    m = xv.shape[0] * ho * wo
    op = db_op(kh, kw, stride)
    dtype = LOW_DTYPES[xv.dtype]
    config, tier, sig = ctx.choose(FAMILY, op, dtype, cout, cin * kh * kw, static_int(m))
    ins = _Insert(graph, tail)
    x_nhwc = src if kind == "view" else ins(aten.permute.default, x, [0, 2, 3, 1])
    w_krsc = ins(aten.permute.default, w, [0, 2, 3, 1])
    if cin > 1:  # Cin = 1: [Cout, KH, KW, 1] is already packed
        w_krsc = ins(aten.clone.default, w_krsc, memory_format=torch.contiguous_format)
    y = ins(torch.ops.oasr.conv2d_activation.default, x_nhwc, w_krsc, b, stride, padding, activation, config)
    view = ins(aten.permute.default, y, [0, 3, 1, 2])
    tail.replace_all_uses_with(view)
    for node in (conv, act_node):  # shape queries of the chain (symbolic shapes) read the same-shaped view
        for u in list(node.users) if node is not None else ():
            if is_call(u, *META_OPS):
                u.replace_input_with(node, view)
    _views_to_reshapes(view)
    _erase_unused(graph, [n for n in (act_node, conv) if n is not None])
    if kind == "view":
        _erase_unused(graph, [x])
    ctx.record(sig, FAMILY, op, dtype, cout, cin * kh * kw, m, config=config, tier=tier, node=conv.name,
               activation=activation, bias=b is not None)
    return y


def _linear_weight(node: torch.fx.Node, a: torch.fx.Node) -> torch.fx.Node | None:
    """The transposed weight of a Linear mm/addmm reading `a`: permute(W, [1, 0]) of a 2-D parameter W, or the
    constant freezing folded that permute into (`is_frozen_transposed_weight`); None otherwise."""
    if is_call(node, aten.mm.default) and node.args[0] is a:
        wt = node.args[1]
    elif is_call(node, aten.addmm.default) and node.args[1] is a and not node.kwargs:
        wt = node.args[2]
    else:
        return None
    if is_frozen_transposed_weight(wt):
        return wt
    if not _is_permute(wt, [1, 0]) or not is_weight(wt.args[0]):
        return None
    wv = val(wt.args[0])
    return wt if isinstance(wv, torch.Tensor) and wv.dim() == 2 and known_contiguous(wv) else None


def _weight_shape(wt: torch.fx.Node) -> torch.Size:
    """[N, K] of the weight `_linear_weight` found."""
    return val(wt).t().shape if is_frozen_transposed_weight(wt) else val(wt.args[0]).shape


def _flatten_consumers(flat: torch.fx.Node, width: int) -> list[tuple[torch.fx.Node, torch.fx.Node]] | None:
    """[(linear node, its weight permute)] when every consumer of `flat` (through reshapes keeping the last dim
    `width`) is a Linear whose weight has `width` columns; None otherwise."""
    out: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    todo = [flat]
    while todo:
        node = todo.pop()
        for u in users(node):
            uv = val(u)
            if is_call(u, *_RESHAPES) and isinstance(uv, torch.Tensor) and static_int(uv.shape[-1]) == width:
                todo.append(u)
                continue
            wt = _linear_weight(u, node)
            if wt is None or static_int(_weight_shape(wt)[1]) != width:
                return None
            out.append((u, wt))
    return out or None


def _flatten_free(ctx: RewriteContext, y: torch.fx.Node) -> bool:
    """The frontend's flatten + Linear on the op's NHWC output `y` without the clone (module docstring)."""
    view = single_user(y)
    if not _is_permute(view, [0, 3, 1, 2]):
        return False
    tr = single_user(view)
    if not _is_permute(tr, [0, 2, 1, 3]):
        return False
    nxt = single_user(tr)
    clone = nxt if is_call(nxt, aten.clone.default) else None  # absent where the NCHW tensor was viewable (T' = 1)
    flat = single_user(clone) if clone is not None else nxt
    yv = val(y)
    c, f = static_int(yv.shape[3]), static_int(yv.shape[2])
    if c is None or f is None or not is_call(flat, *_RESHAPES):
        return False
    fv = val(flat)
    if not isinstance(fv, torch.Tensor) or fv.dim() != 3 or static_int(fv.shape[2]) != c * f:
        return False
    linears = _flatten_consumers(flat, c * f)
    if linears is None:
        return False
    graph = ctx.graph
    flat.replace_input_with(clone if clone is not None else tr, y)  # [B, T, F, C] packed -> [B, T, F * C]: a view
    for lin, wt in linears:
        w = untransposed(graph, wt, lin) if is_frozen_transposed_weight(wt) else wt.args[0]
        d = static_int(val(w).shape[0])
        ins = _Insert(graph, lin)
        w3 = ins(aten.view.default, w, [d, c, f])
        wp = ins(aten.clone.default, ins(aten.permute.default, w3, [0, 2, 1]), memory_format=torch.contiguous_format)
        w2 = ins(aten.view.default, wp, [d, f * c])
        w2.meta[PARAM_DERIVED] = True  # so the gemm matcher still takes this Linear
        lin.replace_input_with(wt, ins(aten.permute.default, w2, [1, 0]))
        _erase_unused(graph, [wt])
    _erase_unused(graph, [n for n in (clone, tr, view) if n is not None])
    return True


_STRIDE_KEEPING = (aten.permute.default, aten.transpose.int, aten.t.default, aten.unsqueeze.default,
                   aten.squeeze.dim, aten.squeeze.default)


def _views_to_reshapes(start: torch.fx.Node) -> None:
    """The op's NHWC output reaches old NCHW consumers through a permuted view, whose strides differ from the
    packed NCHW tensor the conv produced: a downstream ``view`` that relied on those strides may no longer be
    expressible as a view. Turn every ``view`` reachable through view-like nodes into ``reshape`` (a copy only
    where needed; the same values)."""
    todo, seen = [start], set()
    while todo:
        node = todo.pop()
        for u in list(node.users):
            if u in seen:
                continue
            seen.add(u)
            if is_call(u, aten.view.default, aten._unsafe_view.default):
                u.target = aten.reshape.default
                todo.append(u)
            elif is_call(u, *_STRIDE_KEEPING, aten.reshape.default):
                todo.append(u)


def _bake_quant(ctx: RewriteContext, node: torch.fx.Node) -> None:
    """An ``oasr.conv2d_activation_quant`` site (the fusion pass's, inductor/fuse_conv_quant.py): its ``auto``
    config baked from the same signature and rule as `conv2d_activation`'s, and the site recorded."""
    x, w, b, stride, padding, activation, _scale, config = node.args[:8]
    xv, wv = val(x), val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dtype not in LOW_DTYPES:
        ctx.skip(node, "conv2d_activation_quant operand without a known shape or dtype")
        return
    cout, kh, kw, cin = (int(s) for s in wv.shape)
    st, pd = _ints(stride, 2), _ints(padding, 2)
    if st is None or pd is None:
        ctx.skip(node, f"stride {stride} / padding {padding} not two static ints")
        return
    m = xv.shape[0] * out_extent(xv.shape[1], kh, st[0], pd[0]) * out_extent(xv.shape[2], kw, st[1], pd[1])
    op, dtype = db_op(kh, kw, st), LOW_DTYPES[xv.dtype]
    tier = ""
    if config == "auto":
        config, tier, sig = ctx.choose(FAMILY, op, dtype, cout, cin * kh * kw, static_int(m))
        node.args = (*node.args[:7], config, *node.args[8:])
    else:
        sig = signature(op, cout, cin * kh * kw)
    ctx.record(sig, FAMILY, op, dtype, cout, cin * kh * kw, m, config=config, tier=tier, node=node.name,
               activation=activation, bias=b is not None)


def rewrite(ctx: RewriteContext) -> None:
    """Every 2-D conv of `ctx.graph` this family serves -> the op (module docstring); the int8-output sites of the
    quantization fusion baked; then the flatten (also after an int8 conv, whose output is NHWC too)."""
    ops: list[torch.fx.Node] = []
    for node in list(ctx.graph.nodes):
        if is_call(node, torch.ops.oasr.conv2d_activation_quant.default):
            _bake_quant(ctx, node)
            continue
        if is_call(node, torch.ops.oasr.conv2d_int8_activation.default):
            ops.append(node)
            continue
        if not is_call(node, aten.convolution.default):
            continue
        xv = val(node.args[0])
        if not isinstance(xv, torch.Tensor) or xv.dim() != 4:
            continue  # 1-D convs: the conv1d family records them
        y = _rewrite_conv(ctx, node)
        if y is not None:
            ops.append(y)
    for y in ops:
        _flatten_free(ctx, y)


__all__ = ["rewrite", "conv_reason", "ACTIVATIONS"]
