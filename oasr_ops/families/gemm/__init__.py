"""The fp16/bf16 GEMM family (`torch.ops.oasr.gemm`): ``a @ w.T + bias`` then an activation, nn.Linear's GEMM.

DB ops: ``gemm`` (no activation) and ``gemm_activation``; signatures carry ``dt=``. Untuned policy: the native
lane's default config.
"""
from __future__ import annotations

from ...codegen.render import render
from ...runtime import registry
from . import candidates, prebuild
from . import ops  # noqa: F401  (registers torch.ops.oasr.gemm)
from .lanes import LANES
from . import rewrite  # the graph matcher (handlers["rewrite"])

FAMILY = registry.register(registry.FamilySpec(
    name="gemm",
    ops=("gemm", "gemm_activation"),
    lanes=LANES,
    dtyped=True,
    policy="default",
    no_arch="default",
    modelled=True,
    eager_regions=True,
    render=render,
    handlers={"reset_plans": ops.reset_plans, "served": ops.served,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "prebuild_specs": prebuild.prebuild_specs,
              "rewrite": rewrite.rewrite},
))
