"""The backend's residual fusion pass (``options={"fuse_residual": ...}``, on with ``fuse_quantization``): an int8
or fp8 GEMM whose output is only added to the residual stream becomes one `oasr.scaled_mm_residual` /
`oasr.scaled_mm_fp8_residual` call, on Dynamo's graph (issue 15).

Matched (both operand orders of the add; views between the GEMM and the multiply looked through; `scaled_mm`
stands for either family's GEMM, the replacement for its residual op)::

    add(r, mul(alpha, scaled_mm(a, w, sa, sw, bias, dt, cfg)))     alpha a Python number (0.5: a macaron FFN)
    add(r, mul(scaled_mm(...), alpha))
    add(r, scaled_mm(...))                                          alpha = 1
 -> restore_rows(scaled_mm_residual(a, w, sa, sw, bias, r.contiguous().reshape(-1, N), alpha, dt, cfg), r)

only when: the GEMM's output (through its views) and the multiply have no other user (else the fp16 product is
needed anyway and nothing is saved); r is a tensor of exactly the add's shape and the GEMM's output dtype (no
broadcast, no type promotion: an fp32 model's residual stream is not fused); a is 2-D (the quantized paths of
both families reshape the activations to [M, K]). Why it can pay: the kernel after the add (Inductor's LayerNorm +
quantize of the next block, which fuses the add today) then reads one [M, N] tensor instead of two, and the fp16
GEMM output is never written separately; the epilogue reads the residual instead (TMA, overlapped with the next tile's mainloop on
the persistent kernels). Measured: docs/perf/e2e.md ("Residual adds" for int8, "Session 35" for fp8).

Why on Dynamo's graph: the same as `fuse_quant` (our ops and the reshapes are single nodes there, and the result is
what AOTAutograd traces, so Inductor's cache key covers it).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..families.quant_patterns import (_QUANT, _QUANT_CAL, _QUANT_FP8, _QUANT_FP8_CAL, _SCALED_MM, _SCALED_MM_FP8,
                                       eliminate_dead_code, restore_rows, through_views)
from .pass_log import PassLog

_ADDS = {operator.add, torch.add}
_MULS = {operator.mul, torch.mul}
# the GEMM -> its residual op (same arguments, then residual and alpha before out_dtype and config)
_RESIDUAL_OP = {**{t: torch.ops.oasr.scaled_mm_residual.default for t in _SCALED_MM},
                **{t: torch.ops.oasr.scaled_mm_fp8_residual.default for t in _SCALED_MM_FP8}}
_QUANTIZERS = _QUANT | _QUANT_CAL | _QUANT_FP8 | _QUANT_FP8_CAL


@dataclass
class ResidualReport:
    fused: int = 0                                      # adds absorbed into oasr.scaled_mm_residual
    alphas: list[float] = field(default_factory=list)   # their alphas, in graph order
    unfused: list[str] = field(default_factory=list)    # GEMM + add sites left as they were, and why


# every report of this process, oldest first, bounded: `RESIDUAL_LOG.mark()` before a compile and
# `RESIDUAL_LOG.since(mark)` after it read that compile's reports (pass_log.py says why not a length)
RESIDUAL_LOG: PassLog[ResidualReport] = PassLog()


def residual_log() -> list[ResidualReport]:
    """The reports kept (the last 64), oldest first."""
    return RESIDUAL_LOG.entries()


def _val(n):
    v = n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape))


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scaled_side(n) -> tuple[torch.fx.Node, float, torch.fx.Node | None] | None:
    """(the scaled_mm node, alpha, the multiply node or None) when `n` is GEMM * alpha or the GEMM (through
    views), else None."""
    if not isinstance(n, torch.fx.Node):
        return None
    mul, alpha, inner = None, 1.0, n
    if n.op == "call_function" and n.target in _MULS and not n.kwargs and len(n.args) == 2:
        x, y = n.args
        if _number(x) and isinstance(y, torch.fx.Node):
            mul, alpha, inner = n, float(x), y
        elif _number(y) and isinstance(x, torch.fx.Node):
            mul, alpha, inner = n, float(y), x
    gemm = through_views(inner)
    if isinstance(gemm, torch.fx.Node) and gemm.op == "call_function" and gemm.target in _RESIDUAL_OP:
        return gemm, alpha, mul
    return None


def _only_feeds(start: torch.fx.Node, end: torch.fx.Node, chain: list[torch.fx.Node]) -> bool:
    """`start`'s only user, followed through single-user views, is `end` (collecting the nodes in `chain`)."""
    n = start
    while True:
        users = list(n.users)
        if len(users) != 1:
            return False
        chain.append(n)
        if users[0] is end:
            return True
        n = users[0]
        if through_views(n) is not start:  # not a view of the GEMM's output
            return False


def _rows_2d(a) -> bool:
    """`a` (the GEMM's activations) is 2-D [M, K]: from its traced value, else from the structure both int8 paths
    give it (nodes the quantization passes inserted carry no value): a quantization's rows of ``x.reshape(-1, K)``
    or fuse_quant's ``h.reshape(-1, K)``. If this were wrong the op's fake would reject the residual's shape when
    AOTAutograd traces the graph: a compile error, never a silently wrong result."""
    v = _val(a)
    if v is not None:
        return v.dim() == 2
    if not isinstance(a, torch.fx.Node):
        return False
    if a.op == "call_method" and a.target == "contiguous":
        return _rows_2d(a.args[0])
    if a.op == "call_method" and a.target == "reshape":
        return len(a.args) == 3  # reshape(x, rows, K)
    if a.op == "call_function" and a.target is operator.getitem and a.args[1] == 0:
        q = a.args[0]
        return isinstance(q, torch.fx.Node) and q.target in _QUANTIZERS and _rows_2d(q.args[0])
    return False


def _scaled_shape(inner: torch.fx.Node, gemm: torch.fx.Node, n: int):
    """The shape of the GEMM's output as the add sees it (`inner`: the GEMM or the last view of it)."""
    v = _val(inner)
    if v is not None:
        return tuple(v.shape)
    if inner.op == "call_function" and inner.target is restore_rows and inner.args[0] is gemm:
        x = _val(inner.args[1])  # restore_rows(y, x): y [M, N] back to x's leading dims
        return None if x is None else (*x.shape[:-1], n)
    return None


def _why_not(add, gemm, alpha, mul, r) -> str | None:
    chain: list[torch.fx.Node] = []
    if not _only_feeds(gemm, mul if mul is not None else add, chain):
        return "the GEMM output has another user"
    if mul is not None and list(mul.users) != [add]:
        return "the scaled GEMM output has another user"
    if not isinstance(r, torch.fx.Node) or r in chain or r is mul:
        return "the other operand is not a tensor independent of the GEMM"
    rv, av, out_dtype = _val(r), _val(add), gemm.args[5]
    if rv is None or av is None:
        return "shapes unknown"
    if not (_same_shape(rv, av) and rv.dtype == av.dtype == out_dtype):
        return (f"residual {tuple(rv.shape)} {rv.dtype} is not exactly the output's {tuple(av.shape)} "
                f"{out_dtype} (broadcast or type promotion)")
    shape = _scaled_shape(chain[-1], gemm, int(av.shape[-1]))
    if shape is None:
        return "the GEMM output's shape is unknown"
    if len(shape) != av.dim() or not all(statically_known_true(x == y) for x, y in zip(shape, av.shape)):
        return f"the GEMM output {shape} is broadcast to {tuple(av.shape)}"
    if not _rows_2d(gemm.args[0]):
        return "the GEMM's activations are not 2-D [M, K] (the pass reshapes the residual to [M, N])"
    if not abs(alpha) < 3.4e38:
        return f"alpha {alpha} is not a finite fp32"
    return None


def fuse_residual_adds(gm: torch.fx.GraphModule) -> ResidualReport:
    """Rewrite every matching add of `gm` in place (module docstring); returns what was fused and what not."""
    rep = ResidualReport()
    RESIDUAL_LOG.append(rep)
    g = gm.graph
    for add in list(g.nodes):
        if add.op != "call_function" or add.target not in _ADDS or add.kwargs or len(add.args) != 2:
            continue
        why, match = None, None
        for side, other in ((add.args[1], add.args[0]), (add.args[0], add.args[1])):
            found = _scaled_side(side)
            if found is None:
                continue
            gemm, alpha, mul = found
            why = _why_not(add, gemm, alpha, mul, other)
            if why is None:
                match = (gemm, alpha, other)
                break
        if match is None:
            if why is not None:
                rep.unfused.append(f"{add.name}: {why}")
            continue
        gemm, alpha, r = match
        a, w, sa, sw, bias, out_dtype = gemm.args[:6]
        config = gemm.args[6] if len(gemm.args) > 6 else gemm.kwargs.get("config", "auto")
        n = int(_val(add).shape[-1])
        with g.inserting_before(add):
            r2 = g.call_method("reshape", (g.call_method("contiguous", (r,)), -1, n))
            out = g.call_function(_RESIDUAL_OP[gemm.target], (a, w, sa, sw, bias, r2, alpha, out_dtype, config))
            res = g.call_function(restore_rows, (out, r))
        res.meta.update(add.meta)
        add.replace_all_uses_with(res)
        g.erase_node(add)
        rep.fused += 1
        rep.alphas.append(alpha)
    eliminate_dead_code(g)
    g.lint()
    gm.recompile()
    return rep
