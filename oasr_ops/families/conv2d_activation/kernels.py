"""The conv2d_activation family's kernels: the compile set, JIT specs and loading the ``oasr_conv2d_*`` launcher."""
from __future__ import annotations

import ctypes

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary, load_launcher
from ...codegen.render_conv2d import CONV2D_ABI_VERSION, INT8_VARIANTS, QUANT_VARIANTS
from ...configs import Config, Lane
from ...runtime.production import prebuild_choice

DTYPES = ("fp16", "bf16")
_SHAPE_NAMES = ["B", "H", "W", "Cin", "Cout", "KH", "KW", "stride_h", "stride_w", "pad_h", "pad_w", "act"]


def prebuild_specs(arch: str, all_: bool = False, dtypes: tuple[str, ...] = DTYPES,
                   configs: list[Config] | None = None) -> list[JitSpec]:
    """`oasr tune prebuild`'s conv2d set for `arch`: every chosen config (`configs`, else the production set, else
    with `all_` the whole lane) x dtype, plus what an int8 frontend runs (`QuantConv2d` + the fusion pass) for each
    fp16/bf16 dtype: the int8-output variant of every chosen direct config and, on sm90, the int8 conv lane's
    tiles `ops_int8.untuned_tile` answers (every tile with `all_`; the lane is not the family's, so nothing else
    builds them)."""
    from ...runtime.registry import native_lane
    from .lanes import INT8_UNTUNED_TILES, SM90_INT8_CONV2D

    lane = native_lane(arch, "conv2d_activation")
    if lane is None:
        return []
    chosen = prebuild_choice(lane, arch, all_, configs)
    specs = [JitSpec.for_kernel(lane, c, dt, arch) for c in chosen for dt in dtypes]
    int8_dtypes = [dt for dt in dtypes if f"{dt}_q8" in QUANT_VARIANTS]
    specs += [JitSpec.for_kernel(lane, c, f"{dt}_q8", arch) for c in chosen if c.generation == "dc"
              for dt in int8_dtypes]
    if arch in SM90_INT8_CONV2D.arch_families and configs is None:
        tiles = SM90_INT8_CONV2D.space if all_ else tuple(SM90_INT8_CONV2D.get(t) for t in INT8_UNTUNED_TILES)
        specs += [JitSpec.for_kernel(SM90_INT8_CONV2D, c, f"int8_{dt}", arch) for c in tiles for dt in int8_dtypes]
    return specs


_KERNELS = KernelCache()


# Each kernel variant's C launcher (`templates/_conv2d_abi.cu.j2`): prefix -> its pointer arguments, which come before
# the 12 shape ints (B, H, W, Cin, Cout, KH, KW, sh, sw, ph, pw, act) and are followed by workspace, workspace_bytes,
# stream; ``<prefix>_can_implement`` / ``_workspace_size`` take the 12 ints.
_LAUNCHERS = {
    "conv2d": ("x", "w", "bias", "y"),                              # fp16 / bf16
    "conv2d_int8": ("x", "w", "scale_x", "scale_w", "bias", "y"),   # INT8_VARIANTS (op conv2d_int8_activation)
    "conv2d_quant": ("x", "w", "bias", "out_scale", "y"),           # QUANT_VARIANTS (op conv2d_activation_quant)
}


def launcher_prefix(dtype: str) -> str:
    """The launcher a kernel of variant `dtype` (render_conv2d) exports."""
    return "conv2d_int8" if dtype in INT8_VARIANTS else "conv2d_quant" if dtype in QUANT_VARIANTS else "conv2d"


def load_kernel(spec: JitSpec, prefix: str = "conv2d") -> KernelLibrary:
    """The `prefix` launcher of a built kernel (`_LAUNCHERS`), its ABI version checked."""
    pointers = _LAUNCHERS[prefix]
    p, i = ctypes.c_void_p, ctypes.c_int
    shape = [i] * 12
    return load_launcher(spec, prefix, CONV2D_ABI_VERSION, [p] * len(pointers) + shape + [p, ctypes.c_size_t, p],
                         shape, [*pointers, *_SHAPE_NAMES, "workspace", "workspace_bytes", "stream"], _SHAPE_NAMES)


def load_quant_kernel(spec: JitSpec) -> KernelLibrary:
    """The quantizing variants' launcher, ``oasr_conv2d_quant_run(x, w, bias, out_scale, y, ...)`` (y int8)."""
    return load_kernel(spec, "conv2d_quant")


def get_kernel(lane: Lane, config: Config, dtype: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one conv2d kernel (`dtype`: fp16 / bf16, or an int8 / quantizing variant of
    render_conv2d, each with its own launcher). Raises BuildError / LoadError (remembered)."""
    return _KERNELS.get((lane.name, config.id, dtype, arch),
                        lambda: load_kernel(JitSpec.for_kernel(lane, config, dtype, arch), launcher_prefix(dtype)))
