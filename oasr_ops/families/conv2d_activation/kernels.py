"""The conv2d_activation family's kernels: the compile set, JIT specs and loading the ``oasr_conv2d_*`` launcher."""
from __future__ import annotations

import ctypes

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary, load_launcher
from ...codegen.render_conv2d import CONV2D_ABI_VERSION, INT8_VARIANTS
from ...configs import Config, Lane
from ...runtime.production import prebuild_choice

DTYPES = ("fp16", "bf16")
_SHAPE_NAMES = ["B", "H", "W", "Cin", "Cout", "KH", "KW", "stride_h", "stride_w", "pad_h", "pad_w", "act"]


def prebuild_specs(arch: str, all_: bool = False, dtypes: tuple[str, ...] = DTYPES,
                   configs: list[Config] | None = None) -> list[JitSpec]:
    """`oasr tune prebuild`'s conv2d set for `arch`: every chosen config (`configs`, else the production set, else
    with `all_` the whole lane) x dtype."""
    from ...runtime.registry import native_lane

    lane = native_lane(arch, "conv2d_activation")
    if lane is None:
        return []
    return [JitSpec.for_kernel(lane, c, dt, arch) for c in prebuild_choice(lane, arch, all_, configs) for dt in dtypes]


_KERNELS = KernelCache()


def load_kernel(spec: JitSpec) -> KernelLibrary:
    """The launcher of a built kernel: ``oasr_conv2d_run(x, w, bias, y, B, H, W, Cin, Cout, KH, KW, sh, sw, ph, pw,
    act, workspace, workspace_bytes, stream)``; ``can_implement`` / ``workspace_size`` take the 12 ints."""
    p, i = ctypes.c_void_p, ctypes.c_int
    shape = [i] * 12
    return load_launcher(spec, "conv2d", CONV2D_ABI_VERSION, [p, p, p, p, *shape, p, ctypes.c_size_t, p], shape,
                         ["x", "w", "bias", "y", *_SHAPE_NAMES, "workspace", "workspace_bytes", "stream"],
                         _SHAPE_NAMES)


def load_int8_kernel(spec: JitSpec) -> KernelLibrary:
    """The int8 variants' launcher: ``oasr_conv2d_int8_run(x, w, scale_x, scale_w, bias, y, B, H, W, Cin, Cout, KH,
    KW, sh, sw, ph, pw, act, workspace, workspace_bytes, stream)``; ``oasr_conv2d_int8_can_implement`` /
    ``_workspace_size`` take the 12 ints, as the fp16 launcher's."""
    p, i = ctypes.c_void_p, ctypes.c_int
    shape = [i] * 12
    return load_launcher(spec, "conv2d_int8", CONV2D_ABI_VERSION, [p, p, p, p, p, p, *shape, p, ctypes.c_size_t, p],
                         shape, ["x", "w", "scale_x", "scale_w", "bias", "y", *_SHAPE_NAMES, "workspace",
                                 "workspace_bytes", "stream"], _SHAPE_NAMES)


def get_kernel(lane: Lane, config: Config, dtype: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one conv2d kernel. Raises BuildError / LoadError (remembered)."""
    load = load_int8_kernel if dtype in INT8_VARIANTS else load_kernel
    return _KERNELS.get((lane.name, config.id, dtype, arch),
                        lambda: load(JitSpec.for_kernel(lane, config, dtype, arch)))
