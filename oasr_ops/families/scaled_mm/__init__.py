"""The int8 W8A8 family (`torch.ops.oasr.scaled_mm`, `scaled_mm_quant`, `quantize_per_token`).

DB ops: ``scaled_mm`` and ``scaled_mm_quant`` (no dtype in the signature). Untuned policy: the shape heuristic
(a wave model on sm90, an occupancy ladder on sm80; `heuristic.py`). Served (`runtime.select.serve_config`):
Stream-K tiles only from measured entries, never for the quantizing op (it has no Stream-K launcher), and only
ids of the production set (the generic rule plus every heuristic tile, which are always built).
"""
from __future__ import annotations

import functools

from ...codegen.render import render
from ...runtime import production, registry
from . import candidates, heuristic, prebuild
from . import ops  # noqa: F401  (registers the ops)
from . import act_quant  # noqa: F401  (registers oasr::scaled_mm_act_quant: fc1 -> activation -> int8)
from . import residual  # noqa: F401  (registers oasr::scaled_mm_residual: residual + alpha * GEMM)
from .lanes import LANES
from . import quantize, rewrite  # the int8_w8a8 model transform, the graph matcher

FAMILY = registry.register(registry.FamilySpec(
    name="scaled_mm",
    ops=("scaled_mm", "scaled_mm_quant"),
    lanes=LANES,
    dtyped=False,
    policy="heuristic",
    no_arch="default",
    streamk_measured_only=True,
    no_streamk_ops=("scaled_mm_quant",),
    heuristic=heuristic.heuristic,
    production_extras=heuristic.heuristic_ids,
    production_ids=functools.partial(production.production_ids, "scaled_mm"),
    render=render,
    handlers={"reset_plans": ops.reset_plans, "served": ops.served,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "prebuild_specs": prebuild.prebuild_specs, "census_from": candidates.census_from,
              "rewrite": rewrite.rewrite, "quantize_schemes": quantize.schemes,
              "measure_dtype": candidates.measure_dtype,
              # fc1 + GELU/SiLU + fc2's calibrated quantization, fused: scaled_mm_act_quant reads scaled_mm_quant
              "act_quant_op": {"scaled_mm": "scaled_mm_quant"}.get},
))
