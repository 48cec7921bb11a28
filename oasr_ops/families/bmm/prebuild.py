"""What `oasr tune prebuild` compiles for the bmm family: the native lane's production set (lane default,
coverage basis, DB references) or its whole space, each in both B layouts."""
from __future__ import annotations

from ...codegen.jit import JitSpec
from ...configs import Config
from ...runtime.production import prebuild_choice
from ...runtime.registry import native_lane
from .lanes import B_MAJORS, kernel_variant


def prebuild_specs(arch: str, all_: bool, dtypes: tuple[str, ...], configs: list[Config] | None = None
                   ) -> list[JitSpec]:
    lane = native_lane(arch, "bmm")
    if lane is None:
        return []
    chosen = prebuild_choice(lane, arch, all_, configs)
    return [JitSpec.for_kernel(lane, c, kernel_variant(dt, mj), arch) for c in chosen for dt in dtypes
            for mj in B_MAJORS]
