"""What `oasr tune prebuild` compiles for the gemm family: the production set (DB references + lane default +
coverage basis) of every gemm lane that runs on the arch, the whole spaces (`all_`), or exactly `configs`."""
from __future__ import annotations

from ...codegen.jit import JitSpec
from ...configs import Config
from ...runtime.production import prebuild_choice
from .kernels import lanes_for, specs_for


def prebuild_specs(arch: str, all_: bool, dtypes: tuple[str, ...], configs: list[Config] | None = None
                   ) -> list[JitSpec]:
    lanes = lanes_for(arch)
    specs: list[JitSpec] = []
    if configs is not None:  # each config on the first lane (the native one first) whose space holds it
        for c in configs:
            lane = next((l for l in lanes if c in l.space), None)
            if lane is not None:
                specs += specs_for(lane, [c], dtypes, arch)
        return specs
    for lane in lanes:
        specs += specs_for(lane, prebuild_choice(lane, arch, all_), dtypes, arch)
    return specs
