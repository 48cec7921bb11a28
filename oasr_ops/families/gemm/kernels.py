"""The fp16/bf16 GEMM kernel family: which configs a process compiles, and loading one on demand.

`production_configs` is the compile set: what the tuning DB references for this arch, the lane default and a
small coverage basis; `OASR_GEMM_COMPILE_SET=all` compiles the whole space.
"""
from __future__ import annotations

import os
import warnings

from ...codegen.jit import JitSpec, KernelCache, KernelLibrary
from ...configs import Config, ConfigError, Lane, parse
from ...runtime import database
from ...runtime.registry import lane_of, lanes_for  # noqa: F401  (re-exported for the family's users)

DTYPES = ("fp16", "bf16")


def _db_referenced(arch_family: str, family: str) -> list[str]:
    try:
        return list(database.referenced_configs(family, arch_family))
    except Exception as e:  # a broken DB must never stop kernels from being built
        warnings.warn(f"oasr: could not read the tuning DB's config references: {e}", stacklevel=2)
        return []


def production_configs(lane: Lane, arch_family: str) -> list[Config]:
    if os.environ.get("OASR_GEMM_COMPILE_SET", "tuned").strip().lower() == "all":
        return list(lane.space)
    chosen: list[Config] = [lane.default, *lane.coverage_basis]
    for cid in _db_referenced(arch_family, lane.family):
        try:
            c = parse(cid)
        except ConfigError:
            continue
        if c in lane.space and c not in chosen:
            chosen.append(c)
    return chosen


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
