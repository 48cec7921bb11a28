"""The int8 W8A8 family (`torch.ops.oasr.scaled_mm`, `scaled_mm_quant`, `quantize_per_token`).

DB ops: ``scaled_mm`` and ``scaled_mm_quant`` (no dtype in the signature). Untuned policy: the shape heuristic
(a wave model on sm90, an occupancy ladder on sm80). Stream-K tiles only from measured entries, never for the
quantizing op (it has no Stream-K launcher).
"""
from __future__ import annotations

from ...codegen.render import render
from ...runtime import registry
from . import candidates, prebuild
from . import ops  # noqa: F401  (registers the ops)
from .lanes import LANES

FAMILY = registry.register(registry.FamilySpec(
    name="scaled_mm",
    ops=("scaled_mm", "scaled_mm_quant"),
    lanes=LANES,
    dtyped=False,
    policy="heuristic",
    no_arch="default",
    streamk_measured_only=True,
    no_streamk_ops=("scaled_mm_quant",),
    render=render,
    handlers={"reset_plans": ops.reset_plans, "served": ops.served,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "prebuild_specs": prebuild.prebuild_specs, "census_from": candidates.census_from},
))
