"""The fp16/bf16 GEMM kernel family: which configs a process compiles, and loading one on demand.

`production_configs` is the compile set, one rule for every family (`runtime.production`): what the tuning DB
references for this arch, the lane default and a small coverage basis (plus the family's extras);
`OASR_GEMM_COMPILE_SET=all` compiles the whole space.
"""
from __future__ import annotations

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary
from ...configs import Config, Lane
from ...runtime.production import production_configs  # noqa: F401  (re-exported for the family's users)
from ...runtime.registry import lane_of, lanes_for  # noqa: F401  (re-exported for the family's users)

DTYPES = ("fp16", "bf16")


def specs_for(lane: Lane, configs: list[Config], dtypes: tuple[str, ...] = DTYPES,
              arch_family: str | None = None) -> list[JitSpec]:
    """One JitSpec per distinct kernel (split-K variants share theirs)."""
    seen: dict[str, JitSpec] = {}
    for c in configs:
        for dt in dtypes:
            s = JitSpec.for_kernel(lane, c, dt, arch_family)
            seen.setdefault(s.name, s)
    return list(seen.values())


_kernels = KernelCache()


def get_kernel(lane: Lane, config: Config, dtype: str, arch_family: str) -> KernelLibrary:
    """Load (building on first use, JIT) the kernel for `config`. Raises BuildError / LoadError; a failure is
    remembered so a process does not retry a failing build on every call."""
    return _kernels.get((lane.name, config.kernel_key().id, dtype, arch_family),
                        lambda: JitSpec.for_kernel(lane, config, dtype, arch_family).load())
