"""The Conformer conv module's pointwise convolutions (kernel 1, groups 1) as the gemm family's GEMM, read in the
encoder's own [B, T, C] layout, and the transposes sunk through GLU and the padding mask so that the whole module
runs in [B, T, C] with no layout conversion and no copy.

Why the GEMM reads [B, T, C] and not [B, C, T]. In every Conformer written with ``nn.Conv1d`` pointwise convs
(ESPnet, NeMo, HF; `examples.conformer.Conv1dConvolutionModule`) the module's [B, C, T] tensor is
``x.transpose(1, 2)`` of the encoder's contiguous [B, T, C] activations, and its result is transposed back. A
pointwise conv on that view is exactly ``Linear(x_btc)``: one row-major GEMM with M = B * T, N = out channels,
K = in channels, which the gemm family already serves (tuned per shape, bias + activation in the epilogue, any T).
A GEMM on a packed [B, C, T] operand (M-major, batch stride C * T) would need T % 8 == 0 for TMA's 16-byte
strides, which the encoder's frame counts (250, 3001, odd T) do not give. So a pointwise conv whose input is not
such a transposed view stays on aten, with that reason recorded.

What the matcher does (``rewrite_pointwise``)::

    convolution(permute(x_btc, [0, 2, 1]), w [N, K, 1], b?, stride [1], padding [0], dilation [1], False, [0], 1)
      ->  permute(oasr.gemm(x_btc, view(w, [N, K]), b, "none", cfg), [0, 2, 1])       (a view, no copy)

and a ``permute(.., [0, 2, 1])`` consumer of the conv (the module's transpose back) reads the GEMM's [B, T, N]
result directly. The site is recorded as a gemm-family site (signature ``gemm|op=gemm|dt=half|N=..|K=..``, M =
B * T): census, build, prewarm, the tuning report and strict mode treat it like any Linear. A baked answer of
cuBLAS everywhere stays ``oasr.gemm`` with that answer (the same cuBLAS call; see `_rewrite_site`).

``sink_transposes`` then moves the permute below the module's pointwise ops so that the depthwise conv sees a
[B, T, C] input (the conv1d rewrite's layout ``btc``)::

    glu(permute(y), 1)                ->  permute(glu(y, 2), [0, 2, 1])
    where(c, s, permute(y))           ->  permute(where(permute(c), permute(s), y), [0, 2, 1])   (masked_fill)

Without a mask the depthwise conv's input is then ``permute(glu(y, 2))``: the conv1d matcher runs the GLU in the
depthwise kernel's prologue (``glu=True``: it reads the GEMM's [B, T, 2C] output and computes a * sigmoid(g) on
load; the GLU output is never written). With a padding mask between them (``where``), GLU + mask stay one Inductor
elementwise kernel, written in [B, T, C], and the depthwise conv reads that. GLU is not fused into the GEMM's
epilogue (it pairs output columns N/2 apart, which the epilogue visitor trees cannot express).
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import LOW_DTYPES, is_call, is_weight, known_contiguous, single_user, static_int, users, val
from .rewrite import _Builder, _erase, _is_swap_12, _list_is, is_pointwise

aten = torch.ops.aten
GEMM_FAMILY = "gemm"


def pointwise_reason(conv: torch.fx.Node) -> str | None:
    """None when the pointwise conv `conv` can run as the gemm family's GEMM in [B, T, C], else why not."""
    args = list(conv.args) + [None] * (9 - len(conv.args))
    x, w, b, stride, padding, dilation, transposed, out_pad, _groups = args[:9]
    xv, wv = val(x), val(w)
    if not isinstance(xv, torch.Tensor) or xv.dim() != 3:
        return "pointwise conv: input is not a 3-D tensor with metadata"
    if xv.dtype not in LOW_DTYPES or wv.dtype != xv.dtype:
        return f"pointwise conv: dtype {xv.dtype} / weight {wv.dtype} (fp16/bf16 only)"
    n, k = static_int(wv.shape[0]), static_int(wv.shape[1])
    if n is None or k is None or n % 8 or k % 8:
        return f"pointwise conv: channels {tuple(wv.shape[:2])} not static multiples of 8"
    if transposed or not _list_is(stride, 1) or not _list_is(dilation, 1) or not _list_is(padding, 0) \
            or not (out_pad is None or all(static_int(p) == 0 for p in out_pad)):
        return f"pointwise conv: not stride 1 / padding 0 / dilation 1 (stride {stride}, padding {padding})"
    if not is_weight(w):
        return "pointwise conv: weight is not a parameter (graph input or attribute, or autocast's cast of one)"
    if b is not None:
        bv = val(b)
        if not is_weight(b) or not isinstance(bv, torch.Tensor) or bv.dtype != xv.dtype:
            return "pointwise conv: bias is not a parameter of the input's dtype"
    if not _is_swap_12(x):
        return ("pointwise conv: input [B, C, T] is not a transposed [B, T, C] view (an M-major GEMM would need "
                "T % 8 == 0); left on aten")
    src = val(x.args[0])
    if not isinstance(src, torch.Tensor) or src.dim() != 3 or not known_contiguous(src):
        return "pointwise conv: the [B, T, C] tensor under the transpose is not known to be contiguous"
    return None


def _rewrite_site(graph: torch.fx.Graph, conv: torch.fx.Node, ctx: Any) -> None:
    x, w, b = conv.args[0], conv.args[1], conv.args[2]
    x_btc = x.args[0]
    xv, wv, sv = val(x), val(w), val(x_btc)
    n, k = int(wv.shape[0]), int(wv.shape[1])
    dt = LOW_DTYPES[xv.dtype]
    rows = sv.shape[0] * sv.shape[1]
    config, tier, sig = ctx.choose(GEMM_FAMILY, "gemm", dt, n, k, static_int(rows))
    back = single_user(conv)
    transposed_back = _is_swap_12(back)
    bld = _Builder(graph, conv)
    w2 = bld(aten.view.default, w, [n, k])
    # Even where the DB answers cuBLAS at every M (`keeps_aten`) the site becomes oasr.gemm (its "torch" sentinel
    # is the same cuBLAS call): an aten mm here would need the [B * T, K] reshapes, whose sizes are symbolic
    # under dynamic shapes.
    y = bld(torch.ops.oasr.gemm.default, x_btc, w2, b, "none", config)
    name = y.name
    out = y if transposed_back else bld(aten.permute.default, y, [0, 2, 1])
    (back if transposed_back else conv).replace_all_uses_with(out)
    if transposed_back:
        _erase(graph, back)
    _erase(graph, conv)
    _erase(graph, x)
    ctx.record(sig, GEMM_FAMILY, "gemm", dt, n, k, rows, config=config, tier=tier, node=name, activation="none",
               bias=b is not None)


def rewrite_pointwise(graph: torch.fx.Graph, ctx: Any, *, record_skips: bool) -> None:
    """Rewrite every eligible pointwise conv (module docstring); `record_skips`: report the others."""
    for conv in list(graph.nodes):
        if not is_call(conv, aten.convolution.default) or not is_pointwise(conv):
            continue
        why = pointwise_reason(conv)
        if why is None:
            _rewrite_site(graph, conv, ctx)
        elif record_skips:
            ctx.skip(conv, why)


def _swapped(node: Any) -> Any:
    """The [B, T, C] source of `node` when it is a transposed 3-D view, else None."""
    if _is_swap_12(node) and isinstance(val(node.args[0]), torch.Tensor) and val(node.args[0]).dim() == 3:
        return node.args[0]
    return None


def _sink(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """Move a transpose below `node` (glu over channels, or where); True when the graph changed."""
    if is_call(node, aten.glu.default):
        src = _swapped(node.args[0])
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
        if src is None or int(dim) % 3 != 1:
            return False
        bld = _Builder(graph, node)
        new = bld(aten.glu.default, src, 2)
    elif is_call(node, aten.where.self):
        cond, a, b = node.args[:3]
        src = _swapped(b)
        nv = val(node)
        if src is None or not isinstance(nv, torch.Tensor) or nv.dim() != 3:
            return False
        bld = _Builder(graph, node)
        moved = []
        for t in (cond, a):
            tv = val(t)
            if isinstance(tv, torch.Tensor) and tv.dim() == 3:
                moved.append(bld(aten.permute.default, t, [0, 2, 1]))
            elif isinstance(tv, torch.Tensor) and tv.dim() == 0:
                moved.append(t)
            else:
                return False
        new = bld(aten.where.self, moved[0], moved[1], src)
    else:
        return False
    old_src = node.args[0] if is_call(node, aten.glu.default) else node.args[2]
    out = _Builder(graph, node)(aten.permute.default, new, [0, 2, 1])
    node.replace_all_uses_with(out)
    _erase(graph, node)
    if not users(old_src):
        _erase(graph, old_src)
    return True


def sink_transposes(graph: torch.fx.Graph) -> int:
    """Sink [B, T, C] -> [B, C, T] transposes through GLU / where toward the depthwise convs; returns how many."""
    moved = 0
    for node in list(graph.nodes):
        if _feeds_conv(node) and _sink(graph, node):
            moved += 1
    return moved


def _feeds_conv(node: torch.fx.Node, hops: int = 4) -> bool:
    """True when `node`'s value reaches a convolution's input through single-user glu / where nodes (the conv
    module's chain); other graphs keep their transposes where they are."""
    for _ in range(hops):
        u = single_user(node)
        if u is None:
            return False
        if is_call(u, aten.convolution.default):
            return u.args[0] is node
        if not is_call(u, aten.glu.default, aten.where.self):
            return False
        node = u
    return False
