"""The fp8 family's kernels: its production set (the generic rule plus every heuristic tile) and its launcher,
which is the int8 family's C ABI (``oasr_smm_*``: the same arguments, fp8 operands), loaded the same way."""
from __future__ import annotations

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary
from ...configs import Config
from ...runtime import production
from ..scaled_mm.kernels import load_kernel

FAMILY = "scaled_mm_fp8"


def production_configs(arch: str) -> list[Config]:
    """The configs this process compiles and serves for `arch` (`runtime.production` + the heuristic's tiles)."""
    return production.family_production_configs(FAMILY, arch)


_KERNELS = KernelCache()


def get_kernel(lane, config: Config, dtype: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one fp8 kernel; `dtype` is the output: fp16, bf16 or fp8 (the quantizing
    op). Raises BuildError / LoadError (remembered)."""
    return _KERNELS.get((lane.name, config.id, dtype, arch),
                        lambda: load_kernel(JitSpec.for_kernel(lane, config, dtype, arch)))
