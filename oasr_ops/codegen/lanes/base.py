"""What every lane declares: its config space, its default, its feasibility predicates."""
from __future__ import annotations

from dataclasses import dataclass

from ...configs import Config, ConfigError, parse


# Serial split-K adds its partial sums in the output type: each slice after the first rounds once more. With
# bf16's 8-bit mantissa four slices exceeded 1e-2 relative error on random data (H200 GPU suite); fp16 is fine.
MAX_BF16_SPLIT = 2


@dataclass(frozen=True)
class Lane:
    """A kernel generation with its own config space, template and JIT module family.

    `arch_families` are the GPU families the lane's kernels run on; `native_for` the ones it is the default
    lane of. `smem_bytes` is the per-block shared memory the feasibility rule assumes for each family.
    """

    name: str
    family: str  # kernel family served: "gemm", "scaled_mm", ...
    template: str  # file under templates/
    cuda_arch: str  # nvcc target, e.g. "80" or "90a"
    arch_families: tuple[str, ...]
    native_for: tuple[str, ...]
    space: tuple[Config, ...]
    default: Config
    coverage_basis: tuple[Config, ...]
    smem_bytes: dict[str, int]
    operand_bytes: int = 2

    def __post_init__(self) -> None:
        ids = [c.id for c in self.space]
        assert len(ids) == len(set(ids)), f"{self.name}: duplicate configs"
        assert self.default in self.space and all(c in self.space for c in self.coverage_basis)

    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.space)

    def get(self, config_id: str) -> Config:
        """The config of this lane with that id; `ConfigError` if it parses but is not in the space."""
        c = parse(config_id)
        if c not in self.space:
            raise ConfigError(f"config {config_id!r} is not in lane {self.name}'s space")
        return c

    def smem_needed(self, c: Config) -> int:
        m, n, k = c.tile
        per_stage = (m * k + n * k) * self.operand_bytes
        stages = c.stages or 2  # auto carve-out picks what fits; the minimum must fit
        return per_stage * stages

    def infeasible_reason(self, c: Config, *, m: int | None = None, n: int | None = None,
                          k: int | None = None, arch_family: str | None = None,
                          dtype: str | None = None) -> str | None:
        """Why `c` cannot serve this problem on this arch, or None. Static rules only (no GPU needed)."""
        if c not in self.space:
            return f"{c.id} not in lane {self.name}"
        if dtype == "bf16" and c.split_k > MAX_BF16_SPLIT:
            return f"split_k={c.split_k} > {MAX_BF16_SPLIT} with bf16 output (partial sums round to bf16)"
        if arch_family is not None:
            if arch_family not in self.arch_families:
                return f"lane {self.name} does not run on {arch_family}"
            if self.smem_needed(c) > self.smem_bytes.get(arch_family, min(self.smem_bytes.values())):
                return f"{c.id} needs {self.smem_needed(c)} B of shared memory"
        if n is not None and n % c.alignment:
            return f"N={n} not a multiple of alignment {c.alignment}"
        if k is not None:
            if k % c.alignment:
                return f"K={k} not a multiple of alignment {c.alignment}"
            k_tiles = -(-k // c.tile[2])
            if c.split_k > k_tiles:
                return f"split_k={c.split_k} exceeds the {k_tiles} K-tiles of K={k}"
        return None
