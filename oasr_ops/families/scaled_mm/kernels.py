"""The int8 family's kernels: its production set (the generic rule plus every heuristic tile) and its C
launcher (``oasr_smm_*``) on top of the shared JIT build/load."""
from __future__ import annotations

import ctypes

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary, load_launcher
from ...configs import Config
from ...runtime import production

FAMILY = "scaled_mm"


def production_configs(arch: str) -> list[Config]:
    """The configs this process compiles and serves for `arch`: the generic rule (`runtime.production`: lane
    default, coverage basis, what the tuning DB references; ``OASR_GEMM_COMPILE_SET=all``: the whole lane) plus
    every tile the heuristic can answer (the spec's `production_extras`)."""
    return production.family_production_configs(FAMILY, arch)


_KERNELS = KernelCache()


def get_kernel(lane, config: Config, dtype: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one scaled_mm kernel. Raises BuildError / LoadError (remembered)."""
    return _KERNELS.get((lane.name, config.id, dtype, arch),
                        lambda: load_kernel(JitSpec.for_kernel(lane, config, dtype, arch)))


def load_kernel(spec) -> KernelLibrary:
    """The scaled_mm launcher (``oasr_smm_*``: scale pointers, per-row/per-column flags, optional bias and
    out_scale) of a built kernel; of a residual variant (``<dtype>_res``) its ``oasr_smmr_*`` launcher, whose run
    takes the residual pointer and a float alpha where the others take out_scale and its per-row flag."""
    from ...codegen.variants import RESIDUAL_SUFFIX, SMM_ABI_VERSION, SMMR_ABI_VERSION

    p, i = ctypes.c_void_p, ctypes.c_int
    if spec.dtype.endswith(RESIDUAL_SUFFIX):
        return load_launcher(spec, "smmr", SMMR_ABI_VERSION,
                             [p, p, p, i, p, i, p, p, ctypes.c_float, p, i, i, i, p, ctypes.c_size_t, p], [i, i, i])
    return load_launcher(spec, "smm", SMM_ABI_VERSION, [p, p, p, i, p, i, p, p, i, p, i, i, i, p, ctypes.c_size_t, p],
                         [i, i, i])
