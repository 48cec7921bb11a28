"""What `oasr tune prebuild` compiles for the int8 family: the native lane's production set (the gemm rule plus
every tile the heuristic answers) or its whole space, with fp16/bf16 output kernels and, for data-parallel tiles,
the quantizing (int8 output) variant."""
from __future__ import annotations

from ...codegen.jit import JitSpec
from ...configs import Config
from ...runtime.registry import native_lane
from . import ops as _ops


def prebuild_specs(arch: str, all_: bool, dtypes: tuple[str, ...], configs: list[Config] | None = None
                   ) -> list[JitSpec]:
    lane = native_lane(arch, _ops.FAMILY)
    if lane is None:
        return []
    if configs is not None:
        chosen = [c for c in configs if c in lane.space]
    else:
        chosen = list(lane.space) if all_ else _ops.production_configs(arch)
    specs = [JitSpec.for_kernel(lane, c, dt, arch) for c in chosen for dt in dtypes]
    # the quantizing launcher (int8 output) exists for data-parallel tiles only
    specs += [JitSpec.for_kernel(lane, c, "int8", arch) for c in chosen if c.kernel_schedule != "streamk"]
    return specs
