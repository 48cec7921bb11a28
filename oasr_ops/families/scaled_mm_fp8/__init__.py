"""The fp8 e4m3 W8A8 family (`torch.ops.oasr.scaled_mm_fp8`, `scaled_mm_fp8_quant`, `quantize_per_token_fp8`).

DB file ``scaled_mm_fp8.json``, ops ``scaled_mm_fp8`` / ``scaled_mm_fp8_quant`` (no dtype in the signature).
Lanes: sm90_fp8_wgmma (CUTLASS 3.x, native on sm90), sm89_fp8_mma (CUTLASS 2.x, native on sm89). Untuned
policy: ``torch`` (torch._scaled_mm rowwise). The spec's half-wave heuristic (`heuristic.py`) measured 0.79x of
torch._scaled_mm geomean over the H200 build's 231 points (118 below 0.98x, worst 0.21x;
benchmarks/logs/sm90_scaled_mm_fp8_build_v1.jsonl, docs/perf/scaled_mm_fp8.md), so an uncovered shape gets cuBLAS;
the heuristic stays an arm of the build and an explicit config ("heuristic"). That holds for the bf16 output only,
where torch is one call: an fp16 output and the quantizing op get the heuristic's tile where the answer is
``torch`` (`ops.heuristic_where_torch`; their torch arm is an fp32 GEMM plus eager passes).
Served (`runtime.select.serve_config`): Stream-K tiles only from measured entries, never for the quantizing op; only ids of the production set; another lane's config is
warned about once and skipped. Scheme ``fp8_w8a8`` (`quantize.py`).
"""
from __future__ import annotations

import functools

from ...codegen.render import render
from ...runtime import production, registry
from . import candidates, heuristic, prebuild
from . import ops  # noqa: F401  (registers the ops)
from . import act_quant  # noqa: F401  (registers oasr::scaled_mm_fp8_act_quant: fc1 -> activation -> e4m3)
from . import residual  # noqa: F401  (registers oasr::scaled_mm_fp8_residual: residual + alpha * GEMM)
from .lanes import LANES
from . import qconfig, quantize, rewrite  # noqa: F401  (qconfig registers "fp8_w8a8")

FAMILY = registry.register(registry.FamilySpec(
    name="scaled_mm_fp8",
    ops=("scaled_mm_fp8", "scaled_mm_fp8_quant"),
    lanes=LANES,
    dtyped=False,
    policy="torch",
    no_arch="default",
    streamk_measured_only=True,
    wave_guard_dtype="fp8",  # the build's wave guard holds regions between measured points (tune/region_guard.py)
    no_streamk_ops=("scaled_mm_fp8_quant",),
    heuristic=heuristic.heuristic,
    production_extras=heuristic.heuristic_ids,
    production_ids=functools.partial(production.production_ids, "scaled_mm_fp8"),
    render=render,
    handlers={"reset_plans": ops.reset_plans, "served": ops.served,
              "candidates": candidates.candidates, "operands": candidates.operands,
              "prebuild_specs": prebuild.prebuild_specs, "census_from": candidates.census_from,
              "rewrite": rewrite.rewrite, "quantize_schemes": quantize.schemes,
              "measure_dtype": candidates.measure_dtype, "gate_dtypes": candidates.gate_dtypes,
              # the fused fc1 (scaled_mm_fp8_act_quant) reads the quantizing op's entries
              "act_quant_op": {"scaled_mm_fp8": act_quant.DB_OP}.get},
))
