"""The backend's conv quantization fusion, on Dynamo's graph (part of ``fuse_quantization``; `fuse_quant`).

A `QuantConv2d` (families/conv2d_activation/quantize.py) inlines to ``permute(x, [0, 2, 3, 1]) ->
oasr.quantize_per_tensor(., s) -> contiguous -> oasr.conv2d_int8_activation(..., "none", ...) -> permute(., [0, 3,
1, 2])``. Two rewrites:

1. Producer: ``conv2d(x, w, b) -> relu|silu|gelu -> permute -> oasr.quantize_per_tensor(., s)`` becomes
   ``oasr.conv2d_activation_quant(x_nhwc, w_krsc, b, stride, padding, act, s)``: the first frontend conv writes the
   second's int8 input itself (half the bytes of its fp16 output, no quantization pass). Only where the untuned
   rule serves that conv with the direct kernel (K = Cin * KH * KW <= `ops.DIRECT_MAX_K`: the kernels with an int8
   output; a larger conv is cuDNN's, which cannot write int8; a tuned DB entry naming cuDNN for this conv makes the
   op run cuDNN and then quantize: correct, no gain), with groups 1, dilation 1, fp16/bf16, and its activated
   output read by nothing else. x becomes NHWC through a permute (a view for Cin = 1:
   ``feats.unsqueeze(1)``; a copy otherwise), the weight KRSC (a copy of the parameter for Cin > 1, folded under
   freezing). The op's config is baked post-grad like `conv2d_activation`'s (families/conv2d_activation/rewrite.py).
2. Activation: ``oasr.conv2d_int8_activation(..., "none", ...) -> permute -> relu|silu|gelu`` takes the activation
   into its epilogue.

Why here and not post-grad: the same reason as `fuse_quant`'s (the composite quantization is one node here).
"""
from __future__ import annotations

import torch

from ..families.conv2d_activation.ops import DIRECT_MAX_K
from ..families.quant_patterns import _activation, _arg

_CONV2D = {torch.conv2d, torch.nn.functional.conv2d}
_RELU = {torch.relu, torch.nn.functional.relu}
_QUANT_PER_TENSOR = {torch.ops.oasr.quantize_per_tensor, torch.ops.oasr.quantize_per_tensor.default}
_INT8_CONV = {torch.ops.oasr.conv2d_int8_activation, torch.ops.oasr.conv2d_int8_activation.default}
_ACT_ARG = 7  # conv2d_int8_activation(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype, config)


def conv_activation(n) -> str | None:
    """relu / silu / gelu (erf) when `n` applies one out of place, else None."""
    if not isinstance(n, torch.fx.Node):
        return None
    if n.op == "call_function" and n.target in _RELU and not _arg(n, 1, "inplace", False):
        return "relu"
    if n.op == "call_method" and n.target == "relu":
        return "relu"
    return _activation(n)


def _permute_dims(n) -> list[int] | None:
    if not isinstance(n, torch.fx.Node):
        return None
    if n.op == "call_method" and n.target == "permute":
        dims = n.args[1:] if len(n.args) > 2 else n.args[1]
    elif n.op == "call_function" and n.target is torch.permute:
        dims = _arg(n, 1, "dims")
    else:
        return None
    return [int(d) for d in dims] if isinstance(dims, (list, tuple)) else None


def _only_user(n: torch.fx.Node) -> torch.fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _pair(v) -> list[int] | None:
    if isinstance(v, int):
        return [v, v]
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return [int(i) for i in v]
    return None


def conv2d_args(conv) -> tuple | None:
    """(x, w, bias, stride, padding) of a Dynamo ``conv2d`` node with groups 1, dilation 1, integer padding and
    4-D fp16/bf16 operands of one dtype, else None."""
    if not (isinstance(conv, torch.fx.Node) and conv.op == "call_function" and conv.target in _CONV2D):
        return None
    x, w = conv.args[0], _arg(conv, 1, "weight")
    b = _arg(conv, 2, "bias")
    stride, padding = _pair(_arg(conv, 3, "stride", 1)), _pair(_arg(conv, 4, "padding", 0))
    dilation, groups = _pair(_arg(conv, 5, "dilation", 1)), _arg(conv, 6, "groups", 1)
    xv = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    wv = w.meta.get("example_value") if isinstance(w, torch.fx.Node) else None
    if stride is None or padding is None or dilation != [1, 1] or groups != 1:
        return None
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 4 or wv.dim() != 4:
        return None
    if xv.dtype not in (torch.float16, torch.bfloat16) or wv.dtype != xv.dtype:
        return None
    return x, w, b, stride, padding


def direct_conv_args(conv) -> tuple | None:
    """`conv2d_args` of a conv the direct kernel serves (module docstring), else None."""
    args = conv2d_args(conv)
    if args is None:
        return None
    cout, cin, kh, kw = (int(s) for s in args[1].meta["example_value"].shape)
    return args if cin * kh * kw <= DIRECT_MAX_K and cout % 8 == 0 else None


def quantized_conv_producer(q: torch.fx.Node) -> tuple | None:
    """(conv, activation node, activation, permute) when `q` = quantize_per_tensor(permute(act(conv2d(..)), [0, 2, 3,
    1])) with each link read only by the next and a direct-kernel conv; else None."""
    perm = q.args[0]
    if _permute_dims(perm) != [0, 2, 3, 1] or _only_user(perm) is not q:
        return None
    act_node = perm.args[0]
    act = conv_activation(act_node)
    if act is None or _only_user(act_node) is not perm:
        return None
    conv = act_node.args[0]
    if not isinstance(conv, torch.fx.Node) or _only_user(conv) is not act_node or direct_conv_args(conv) is None:
        return None
    return conv, act_node, act, perm


def fuse_conv_quantization(gm: torch.fx.GraphModule) -> tuple[int, int]:
    """Both rewrites (module docstring) on `gm` in place (no recompile: the caller's); returns (producers fused,
    activations folded)."""
    g = gm.graph
    producers = 0
    for q in [n for n in g.nodes if n.op == "call_function" and n.target in _QUANT_PER_TENSOR]:
        found = quantized_conv_producer(q)
        if found is None:
            continue
        conv, _act_node, act, _perm = found
        x, w, b, stride, padding = direct_conv_args(conv)
        with g.inserting_before(q):
            x_nhwc = g.call_method("contiguous", (g.call_method("permute", (x, 0, 2, 3, 1)),))
            w_krsc = g.call_method("contiguous", (g.call_method("permute", (w, 0, 2, 3, 1)),))
            fused = g.call_function(torch.ops.oasr.conv2d_activation_quant.default,
                                    (x_nhwc, w_krsc, b, stride, padding, act, q.args[1], "auto"))
        q.replace_all_uses_with(fused)
        producers += 1
    folded = 0
    for conv in [n for n in g.nodes if n.op == "call_function" and n.target in _INT8_CONV]:
        if len(conv.args) <= _ACT_ARG or conv.args[_ACT_ARG] != "none":
            continue
        perm = _only_user(conv)
        if _permute_dims(perm) != [0, 3, 1, 2]:
            continue
        act_node = _only_user(perm)
        act = conv_activation(act_node)
        if act is None or act_node.args[0] is not perm:
            continue
        conv.args = (*conv.args[:_ACT_ARG], act, *conv.args[_ACT_ARG + 1:])
        act_node.replace_all_uses_with(perm)
        folded += 1
    return producers, folded


# Output channels the int8 conv was measured to pay at (docs/perf/conv.md, session 10: Cout 384 and 512, 1.5-1.7x
# cuDNN's fp16 conv on its 128- or 256-wide tiles). Elsewhere every int8 tile computes columns past Cout (Cout = 144:
# 256 columns, 44 % of them wasted), unmeasured: `fusable_convs` leaves those convs fp16.
FUSABLE_COUT_MULTIPLE = 128


def fusable_convs(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The ``conv2d`` nodes of a Dynamo graph (before `quantize_`) whose int8 input quantization rewrite 1 absorbs:
    input ``act(conv2d(...))`` of a direct-kernel conv, read by nothing else, with Cout a multiple of
    `FUSABLE_COUT_MULTIPLE` (`oasr_ops.fusable_filter`, ``layers="fusable"``)."""
    out = []
    for n in gm.graph.nodes:
        args = conv2d_args(n)
        if args is None or int(args[1].meta["example_value"].shape[0]) % FUSABLE_COUT_MULTIPLE:
            continue
        act_node = n.args[0]
        if conv_activation(act_node) is None or _only_user(act_node) is not n:
            continue
        src = act_node.args[0]
        if isinstance(src, torch.fx.Node) and _only_user(src) is act_node and direct_conv_args(src) is not None:
            out.append(n)
    return out
