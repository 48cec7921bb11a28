"""The conv1d family: the Conformer convolution module (`torch.ops.oasr.conv1d_depthwise`, GLU prologue optional).

DB ops: ``conv1d`` (activations [B, C, T]) and ``conv1d_btc`` ([B, T, C]); signatures
``conv1d|op=<op>|dt=half|N=<C>|K=<Kw>`` with exact ``"BxT"`` points first, then regions over M = B * T (spec).
Untuned policy: the lane default (ops.py says why; benchmarks/conv1d.py measures it against cuDNN). Tunable:
`candidates` (cuDNN + the depthwise space) and `operands`.
The ``rewrite`` handler `_rewrite_handler` runs the module in [B, T, C]: pointwise convs as the gemm family's GEMM
(pointwise.py), transposes sunk through GLU / the mask, the depthwise matcher `rewrite.rewrite` (BatchNorm in
either form, SiLU, GLU), and records every site in the pass's result like every family's. It runs before the
other families' matchers (``rewrite_order=-1``).
"""
from __future__ import annotations

from ...codegen.render import render
from ...runtime import registry
from . import ops  # noqa: F401  (registers torch.ops.oasr.conv1d_depthwise)
from . import candidates
from . import pointwise as _pointwise
from . import rewrite as _rewrite
from .kernels import prebuild_specs
from .lanes import LANES
from .ops import conv1d_depthwise, fold_batchnorm  # noqa: F401  (the family's Python API)


def _rewrite_handler(ctx) -> None:
    """`handlers["rewrite"]`: the conv module in [B, T, C]. Pointwise convs on transposed views -> the gemm
    family's GEMM (pointwise.py), transposes sunk through GLU / the mask, then the depthwise matcher (which now
    sees [B, T, C] inputs), then the pointwise convs that only now read a transposed view (the one after the
    depthwise conv); each site and skip is recorded."""
    _pointwise.rewrite_pointwise(ctx.graph, ctx, record_skips=False)
    _pointwise.sink_transposes(ctx.graph)
    res = _rewrite.rewrite(ctx.graph, ctx)
    for s in res.sites:
        op = "conv1d" if s.layout == "bct" else "conv1d_btc"
        ctx.record(s.signature, "conv1d", op, s.dtype, s.channels, s.kernel_width, s.rows, config=s.config,
                   tier=s.tier, node=s.node, activation=s.activation, bias=True)
    ctx.result.skipped.extend(res.skipped)
    _pointwise.rewrite_pointwise(ctx.graph, ctx, record_skips=True)


FAMILY = registry.register(registry.FamilySpec(
    name="conv1d",
    ops=("conv1d", "conv1d_btc"),
    lanes=LANES,
    dtyped=True,
    exact_points=True,
    policy="default",
    no_arch="default",
    render=render,
    impl_variants=("fp16_bct", "fp16_btc"),  # the layout is part of the variant
    rewrite_order=-1,  # first: the conv module's [B, T, C] ops make the Linear form's GEMM inputs contiguous
    handlers={"reset_plans": ops.reset_plans, "served": ops.served, "prebuild_specs": prebuild_specs,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "host_probe": candidates.host_probe,
              "rewrite": _rewrite_handler},
))
