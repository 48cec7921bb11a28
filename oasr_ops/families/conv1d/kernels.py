"""The conv1d family's kernels: the compile set, JIT specs and loading the ``oasr_dwconv_*`` launcher."""
from __future__ import annotations

import ctypes

import torch

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary, load_launcher
from ...codegen.render_conv1d import DWCONV_ABI_VERSION, LAYOUTS, dw_variant
from ...configs import Config, Lane
from ...runtime.production import prebuild_choice

DTYPES = ("fp16", "bf16")
_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def variant_for(dtype: torch.dtype, layout: str) -> str:
    return dw_variant(_NAMES[dtype], layout)


def prebuild_specs(arch: str, all_: bool = False, dtypes: tuple[str, ...] = DTYPES,
                   configs: list[Config] | None = None) -> list[JitSpec]:
    """`oasr tune prebuild`'s conv1d set for `arch`: every chosen config (`configs`, else the production set,
    else with `all_` the whole lane) x dtype x layout (none off-lane)."""
    from ...runtime.registry import native_lane

    lane = native_lane(arch, "conv1d")
    if lane is None:
        return []
    chosen = prebuild_choice(lane, arch, all_, configs)
    return [JitSpec.for_kernel(lane, c, dw_variant(dt, lay), arch) for c in chosen for dt in dtypes
            for lay in LAYOUTS]


_KERNELS = KernelCache()


def load_kernel(spec: JitSpec) -> KernelLibrary:
    """The depthwise launcher of a built kernel: ``oasr_dwconv_run(x, w, w_f32, bias, bias_f32, y, B, T, C, Kw,
    act, glu, workspace, workspace_bytes, stream)``; ``can_implement`` / ``workspace_size`` take (B, T, C, Kw, act,
    glu)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    shape = [i] * 6
    return load_launcher(spec, "dwconv", DWCONV_ABI_VERSION, [p, p, i, p, i, p, *shape, p, ctypes.c_size_t, p], shape)


def get_kernel(lane: Lane, config: Config, variant: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one depthwise kernel. Raises BuildError / LoadError (remembered)."""
    return _KERNELS.get((lane.name, config.id, variant, arch),
                        lambda: load_kernel(JitSpec.for_kernel(lane, config, variant, arch)))
