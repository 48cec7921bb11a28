"""The batched GEMM family (`torch.ops.oasr.bmm`): attention's ``torch.matmul`` products, [L,M,K] x [L,K,N].

DB ops: ``bmm`` (B K-contiguous) and ``bmm_nn`` (B N-contiguous); the M axis is L * M. Untuned policy: cuBLAS
(no CUTLASS bmm tile beat it on enough untuned shapes to be a default; docs/kernels.md).
"""
from __future__ import annotations

from ...codegen.render import render
from ...runtime import registry
from . import candidates, prebuild
from . import ops  # noqa: F401  (registers torch.ops.oasr.bmm)
from .lanes import LANES
from . import rewrite  # the graph matcher (handlers["rewrite"])

FAMILY = registry.register(registry.FamilySpec(
    name="bmm",
    ops=("bmm", "bmm_nn"),
    lanes=LANES,
    dtyped=True,
    policy="torch",
    no_arch="torch",
    modelled=True,
    render=render,
    impl_variants=("fp16_bk", "fp16_bn"),  # the layout is part of the variant
    handlers={"reset_plans": ops.reset_plans, "served": ops.served,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "prebuild_specs": prebuild.prebuild_specs,
              "rewrite": rewrite.rewrite, "census": rewrite.census_points},
))
