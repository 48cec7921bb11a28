"""What `oasr tune prebuild` compiles for the int8 family: the native lane's production set (the gemm rule plus
every tile the heuristic answers) or its whole space, with fp16/bf16 output kernels and, for data-parallel tiles,
the quantizing (int8 output) variant. The production and whole-space sets also hold what a fused int8 deployment
(`quantize_` + `fuse_quantization` / `fuse_residual`) loads, so a served process never compiles at run time: the
act-quant epilogues (``int8_gelu`` / ``int8_silu`` with an fp32 bias or none, and ``int8_<act>_<dtype>bias`` for
each requested dtype: what the fusion pass passes a 16-bit model's bias to) and the residual epilogues
(``<dtype>_res``) of the data-parallel tiles (their selections, `act_quant.select_act_quant_config` and
`residual.select_residual_config`, answer only production tiles: tests/test_prebuild_coverage.py) and the int8
`layer_norm_quant` kernels."""
from __future__ import annotations

from ...codegen.variants import ACTIVATIONS, RESIDUAL_SUFFIX, act_variant
from ...codegen.jit import JitSpec
from ...configs import Config
from ...runtime.production import prebuild_choice
from ...runtime.registry import native_lane
from ..layer_norm_quant import prebuild as _lnq
from . import ops as _ops


def prebuild_specs(arch: str, all_: bool, dtypes: tuple[str, ...], configs: list[Config] | None = None
                   ) -> list[JitSpec]:
    lane = native_lane(arch, _ops.FAMILY)
    if lane is None:
        return []
    chosen = prebuild_choice(lane, arch, all_, configs)  # production set: the generic rule + heuristic tiles
    specs = [JitSpec.for_kernel(lane, c, dt, arch) for c in chosen for dt in dtypes]
    # the quantizing launcher (int8 output) exists for data-parallel tiles only, and so do the fused epilogues
    data_parallel = [c for c in chosen if c.kernel_schedule != "streamk"]
    specs += [JitSpec.for_kernel(lane, c, "int8", arch) for c in data_parallel]
    if configs is None:  # a deployment's set (not a tuning build's exact candidates: those measure plain kernels)
        if lane.default.generation == "3x":  # the fused epilogues exist in the 3.x (sm90) template only
            specs += [JitSpec.for_kernel(lane, c, act_variant(act, bias), arch) for c in data_parallel
                      for act in ACTIVATIONS for bias in (None, *dtypes)]
            specs += [JitSpec.for_kernel(lane, c, f"{dt}{RESIDUAL_SUFFIX}", arch) for c in data_parallel
                      for dt in dtypes]
        specs += _lnq.prebuild_specs(arch, "int8", dtypes, all_)
    return specs
