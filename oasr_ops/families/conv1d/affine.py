"""A per-channel affine chain after a conv — an inference BatchNorm in its decomposed form — matched and folded.

Inductor hands the pass an undecomposed ``_native_batch_norm_legit_no_training`` on some devices and torch versions
and its decomposition on others (the CPU trace of the census, for one)::

    y1 = sub(y, unsqueeze(cast(mean, fp32), -1))            # y [B, C, T]; the vector [C, 1]
    y2 = mul(y1, unsqueeze(mul(reciprocal(sqrt(add(cast(var, fp32), eps))), 1), -1))
    y3 = mul(y2, unsqueeze(gamma, -1));  y4 = add(y3, unsqueeze(beta, -1))
    out = cast(y4, x.dtype)

`match` accepts any single-user chain of ``sub`` / ``add`` / ``mul`` / ``div`` by per-channel [C, 1] vectors
computed from parameters only (no path back to the conv's input) or scalars, ending in the cast back to the
input's dtype (or, as torch 2.11 hands it on CUDA, ending in fp32 and read by a SiLU computed in fp32 that casts
back: ``Affine.ends_in_fp32``, which the caller accepts only with that SiLU), and returns it as ``a * y + c``; `fold` inserts the nodes computing ``w' = w * a`` and
``b' = b * a + c`` in fp32, like `fold_batchnorm`'s formula for the undecomposed op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..graph import is_call, single_user, val

aten = torch.ops.aten
prims = torch.ops.prims
_OPS = {aten.sub.Tensor: "sub", aten.add.Tensor: "add", aten.mul.Tensor: "mul", aten.div.Tensor: "div"}
_MAX_ANCESTORS = 64


@dataclass
class Affine:
    nodes: list[torch.fx.Node] = field(default_factory=list)   # the chain, the cast back last
    steps: list[tuple[str, Any]] = field(default_factory=list)  # (op, vector node or scalar), in order
    # The chain ends in an fp32 value with no cast back: only foldable when what follows ends in the cast back
    # (a SiLU computed in fp32, as torch 2.11's CUDA post-grad graph has it); the caller checks that.
    ends_in_fp32: bool = False


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _parameter_only(v: torch.fx.Node, forbidden: set) -> bool:
    """True when `v` is computed from graph inputs / attributes other than `forbidden` (the conv's input) and from
    no tensor of 3 or more dims (activations are [B, ., .]; a BatchNorm's statistics and affine are 1-D)."""
    seen, todo = set(), [v]
    while todo:
        n = todo.pop()
        nv = val(n)
        if n in forbidden or (isinstance(nv, torch.Tensor) and nv.dim() >= 3 and n is not v):
            return False
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > _MAX_ANCESTORS:
            return False
        todo.extend(a for a in n.all_input_nodes)
    return True


def _vector(v: Any, c: int, forbidden: set) -> bool:
    if _scalar(v):
        return True
    vv = val(v)
    return isinstance(vv, torch.Tensor) and tuple(vv.shape) in ((c, 1), (1, c, 1)) and vv.is_floating_point() \
        and _parameter_only(v, forbidden)


def match(y: torch.fx.Node, dtype: torch.dtype, c: int, forbidden: set) -> Affine | None:
    """The affine chain after `y` (module docstring), or None (also for an empty chain)."""
    res = Affine()
    z = y
    while True:
        u = single_user(z)
        if u is None:
            return None
        if is_call(u, *_OPS) and set(u.kwargs) <= {"alpha"} and u.kwargs.get("alpha", 1) == 1 and len(u.args) == 2:
            op = _OPS[u.target]
            a0, a1 = u.args
            other = a1 if a0 is z else (a0 if op in ("add", "mul") and a1 is z else None)
            if other is None or other is z or not _vector(other, c, forbidden):
                return None
            res.nodes.append(u)
            res.steps.append((op, other))
            z = u
            continue
        cast_back = (is_call(u, prims.convert_element_type.default) and u.args[1] == dtype) or (
            is_call(u, aten._to_copy.default) and len(u.args) == 1 and u.kwargs == {"dtype": dtype})
        if res.steps and cast_back:
            res.nodes.append(u)
            return res
        if res.steps and isinstance(val(z), torch.Tensor) and val(z).dtype == dtype:
            return res  # the vectors were in the input's dtype: no promotion, no cast back
        if res.steps and isinstance(val(z), torch.Tensor) and val(z).dtype == torch.float32 != dtype:
            res.ends_in_fp32 = True  # promoted by fp32 statistics, consumed in fp32 (module docstring)
            return res
        return None


def fold(bld: Any, w32: torch.fx.Node, b32: torch.fx.Node | None, aff: Affine, c: int
         ) -> tuple[torch.fx.Node, torch.fx.Node]:
    """fp32 (w', b') with ``bld(target, *args)`` inserting nodes: a * conv + c folded into the conv."""
    a: Any = 1.0
    k: Any = 0.0

    def vec(v: Any) -> Any:
        return v if _scalar(v) else bld(aten.view.default, bld.f32(v), [c])

    def binop(target: Any, x: Any, y: Any) -> Any:
        if _scalar(x) and _scalar(y):
            return {aten.add.Tensor: x + y, aten.sub.Tensor: x - y, aten.mul.Tensor: x * y,
                    aten.div.Tensor: x / y}[target]
        if _scalar(x):  # number (op) node
            if target is aten.sub.Tensor:
                return bld(aten.add.Tensor, bld(aten.neg.default, y), x)
            if target is aten.div.Tensor:
                return bld(aten.mul.Tensor, bld(aten.reciprocal.default, y), x)
            return bld(target, y, x)
        return bld(target, x, y)

    for op, v in aff.steps:
        v = vec(v)
        if op == "sub":
            k = binop(aten.sub.Tensor, k, v)
        elif op == "add":
            k = binop(aten.add.Tensor, k, v)
        elif op == "mul":
            a, k = binop(aten.mul.Tensor, a, v), binop(aten.mul.Tensor, k, v)
        else:
            a, k = binop(aten.div.Tensor, a, v), binop(aten.div.Tensor, k, v)
    a_node = a if not _scalar(a) else bld(aten.full.default, [c], float(a), dtype=torch.float32,
                                          device=val(w32).device)
    w2 = bld(aten.mul.Tensor, w32, bld(aten.view.default, a_node, [c, 1, 1]))
    b2 = k if b32 is None else binop(aten.add.Tensor, bld(aten.mul.Tensor, b32, a_node), k)
    if _scalar(b2):
        b2 = bld(aten.full.default, [c], float(b2), dtype=torch.float32, device=val(w32).device)
    return w2, b2
