"""What `oasr tune prebuild` compiles for the fp8 family: the native lane's production set (the generic rule
plus every heuristic tile) or its whole space, fp16/bf16-output kernels and, for data-parallel tiles, the
quantizing (fp8-output) variant. The production and whole-space sets also hold what a fused fp8 deployment loads
(as the int8 family's, families/scaled_mm/prebuild.py): the act-quant epilogues (``fp8_gelu`` / ``fp8_silu``) and
the residual epilogues (``<dtype>_res``) of the data-parallel tiles of a lane that has them and the fp8
`layer_norm_quant` kernels."""
from __future__ import annotations

from ...codegen.variants import FP8_ACT_VARIANTS as ACT_VARIANTS
from ...codegen.variants import RESIDUAL_SUFFIX
from ...codegen.jit import JitSpec
from ...configs import Config
from ...runtime.production import prebuild_choice
from ...runtime.registry import native_lane
from ..layer_norm_quant import prebuild as _lnq
from . import ops as _ops
from .act_quant import _act_lane


def prebuild_specs(arch: str, all_: bool, dtypes: tuple[str, ...], configs: list[Config] | None = None
                   ) -> list[JitSpec]:
    lane = native_lane(arch, _ops.FAMILY)
    if lane is None:
        return []
    chosen = prebuild_choice(lane, arch, all_, configs)
    specs = [JitSpec.for_kernel(lane, c, dt, arch) for c in chosen for dt in dtypes]
    data_parallel = [c for c in chosen if c.kernel_schedule != "streamk"]
    specs += [JitSpec.for_kernel(lane, c, "fp8", arch) for c in data_parallel]
    if configs is None:  # a deployment's set (a tuning build's exact candidates measure plain kernels only)
        if _act_lane(arch) is lane:  # the 3.x lane: the fused epilogues exist in its template only
            specs += [JitSpec.for_kernel(lane, c, v, arch) for c in data_parallel for v in ACT_VARIANTS]
            specs += [JitSpec.for_kernel(lane, c, f"{dt}{RESIDUAL_SUFFIX}", arch) for c in data_parallel
                      for dt in dtypes]
        specs += _lnq.prebuild_specs(arch, "fp8", dtypes, all_)
    return specs
