"""The bmm family's graph matcher: ``bmm(a [L, M, K], b [L, K, N])`` (what `torch.matmul` of attention lowers
to) -> ``oasr.bmm(a, b, cfg)``.

Rewritten when the dtype is fp16/bf16, N and K are static, N % 8 == K % 8 == 0, and the traced strides show a
K-contiguous a and a b with N or K contiguous (DB op ``bmm_nn`` / ``bmm``). The op carries
`needs_fixed_stride_order`, so Inductor keeps those strides. Its M axis for selection is L * M (symbolic when the
batch or the sequence is: a region table is baked, as for gemm). The contract is in `oasr_ops.families.graph`.

Census: not censused yet — a bmm point's measurement needs L and M apart (the DB keys rows = L * M), and an
untuned bmm runs cuBLAS (policy ``torch``), so no point is left on a slower kernel. `census_points` says so.
"""
from __future__ import annotations

from typing import Any

import torch

from ..graph import (LOW_DTYPES, CensusPoint, GemmSite, RewriteContext, is_call, keeps_aten, operands_reason,
                     replace_node, static_int, val)

aten = torch.ops.aten

FAMILY = "bmm"


def _candidate(node: torch.fx.Node) -> tuple[tuple[str, str, int, int, Any] | None, str]:
    """(op, dtype name, n, k, rows = L * M) of a rewritable bmm, or the reason it stays on aten."""
    a, b = node.args[0], node.args[1]
    av, bv = val(a), val(b)
    why = operands_reason((av, bv), lambda: (bv.shape[2], av.shape[2]))
    if why:
        return None, f"bmm {why}"
    n, k = static_int(bv.shape[2]), static_int(av.shape[2])
    a_k, b_n, b_k = (static_int(x) for x in (av.stride(2), bv.stride(2), bv.stride(1)))
    if a_k != 1:
        return None, "bmm a is not K-contiguous"
    if b_n == 1:
        op = "bmm_nn"
    elif b_k == 1:
        op = "bmm"
    else:
        return None, "bmm b has neither N nor K contiguous"
    return (op, LOW_DTYPES[av.dtype], n, k, av.shape[0] * av.shape[1]), ""


def rewrite(ctx: RewriteContext) -> None:
    """aten.bmm -> oasr.bmm (the module docstring); the `rewrite` handler."""
    bmm_op = torch.ops.oasr.bmm.default
    for node in list(ctx.graph.nodes):
        if not is_call(node, aten.bmm.default):
            continue
        cand, why = _candidate(node)
        if cand is None:
            ctx.skip(node, why)
            continue
        op, dt, n, k, rows = cand
        config, tier, sig = ctx.choose(FAMILY, op, dt, n, k, static_int(rows))
        if keeps_aten(config):
            ctx.record(sig, FAMILY, op, dt, n, k, rows, config=config, tier=tier, node=f"{node.name} (kept on aten)")
            continue
        new = replace_node(ctx.graph, node, bmm_op, (node.args[0], node.args[1], config))
        ctx.record(sig, FAMILY, op, dt, n, k, rows, config=config, tier=tier, node=new.name)


def census_points(site: GemmSite) -> list[CensusPoint]:
    """The `census` handler: no points (the module docstring says why)."""
    return []
