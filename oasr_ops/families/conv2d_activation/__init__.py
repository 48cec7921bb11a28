"""The conv2d_activation family: 2-D convs + activation in NHWC (`torch.ops.oasr.conv2d_activation`), for a speech
frontend's Conv2dSubsampling. Its int8 path: `conv2d_int8_activation` (ops_int8.py, the int8 implicit-GEMM conv),
`conv2d_activation_quant` (ops_quant.py, the direct conv writing int8) and `QuantConv2d` (quantize.py).

DB ops ``conv2d_k3s2`` / ``conv2d_k3s1`` / ``conv2d`` (filter geometry); signatures
``conv2d_activation|op=<op>|dt=half|N=<Cout>|K=<Cin*KH*KW>``, regions over M = B * Ho * Wo (ops.py).
Untuned policy ``heuristic`` (`ops.untuned_config`): the direct kernel for a few input channels, cuDNN otherwise.
Tunable: `candidates` (cuDNN in NHWC + the lane's feasible configs) and `operands`.
The ``rewrite`` handler (rewrite.py) runs before the other families' (``rewrite_order=-2``): it permutes the
frontend Linear's weight columns so that Linear reads the NHWC conv output without a copy.
"""
from __future__ import annotations

from ...codegen.render import render
from ...runtime import registry
from . import ops  # noqa: F401  (registers torch.ops.oasr.conv2d_activation)
from . import candidates
from . import rewrite as _rewrite
from .kernels import prebuild_specs
from .lanes import LANES
from .ops import conv2d_activation  # noqa: F401  (the family's Python API)
from .ops_int8 import conv2d_int8_activation, quantize_conv_weight  # noqa: F401  (the int8 conv op)
from .ops_quant import conv2d_activation_quant  # noqa: F401  (registers the int8-output op)
from .quantize import QuantConv2d  # noqa: F401  (registers oasr::quantize_per_tensor)

FAMILY = registry.register(registry.FamilySpec(
    name="conv2d_activation",
    ops=("conv2d_k3s2", "conv2d_k3s1", "conv2d"),
    lanes=LANES,
    dtyped=True,
    policy="heuristic",
    heuristic=ops.untuned_config,
    production_extras=ops.untuned_ids,
    no_arch="torch",
    render=render,
    rewrite_order=-2,  # before the gemm matcher: the frontend Linear's weight is permuted first
    handlers={"reset_plans": ops.reset_plans, "served": ops.served, "prebuild_specs": prebuild_specs,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "host_probe": candidates.host_probe, "rewrite": _rewrite.rewrite},
))
