"""What `oasr tune prebuild` compiles for the fp8 family: the native lane's production set (the generic rule
plus every heuristic tile) or its whole space, fp16/bf16-output kernels and, for data-parallel tiles, the
quantizing (fp8-output) variant."""
from __future__ import annotations

from ...codegen.jit import JitSpec
from ...configs import Config
from ...runtime.production import prebuild_choice
from ...runtime.registry import native_lane
from . import ops as _ops


def prebuild_specs(arch: str, all_: bool, dtypes: tuple[str, ...], configs: list[Config] | None = None
                   ) -> list[JitSpec]:
    lane = native_lane(arch, _ops.FAMILY)
    if lane is None:
        return []
    chosen = prebuild_choice(lane, arch, all_, configs)
    specs = [JitSpec.for_kernel(lane, c, dt, arch) for c in chosen for dt in dtypes]
    specs += [JitSpec.for_kernel(lane, c, "fp8", arch) for c in chosen if c.kernel_schedule != "streamk"]
    return specs
