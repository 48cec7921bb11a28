"""The kernel config space: explicit parameters, stable human-readable ids, sentinels.

A `Config` names *how* a GEMM is tiled and scheduled; it says nothing about dtypes or the epilogue, which
are properties of the op call. Ids round-trip: ``parse(cfg.id) == cfg``.

Id grammar (``_kN`` split-K and ``_aN`` alignment suffixes are omitted at their defaults, 1 and 8). Every config
has exactly one id: `parse` accepts only the canonical spelling (``parse(x).id == x``), so no default suffix spelt
out (``_k1``, ``_a8``), no ``_k0`` / ``_a0`` / ``_s0``, no leading zeros, no whitespace or trailing newline:

* CUTLASS 2.x multistage (mma.sync): ``b{M}x{N}x{K}_w{M}x{N}x{K}_s{stages}[_k{split}][_a{align}]``
  e.g. ``b128x128x64_w64x64x64_s3`` — threadblock tile, warp tile, pipeline stages.
* CUTLASS 3.x warp-specialized (wgmma): ``t{M}x{N}x{K}_c{CM}x{CN}_{sched}[_s{stages}][_a{align}][_z{swizzle}][_fa][_swab]``
  with ``sched`` one of ``coop`` (cooperative), ``pp`` (ping-pong), ``sk`` (cooperative + Stream-K), ``ws``
  (the basic, non-persistent warp-specialized kernel: one consumer warpgroup; CUTLASS's sm90 implicit-GEMM conv,
  whose persistent schedules are not supported, uses it: the conv2d_activation family);
  no ``_s`` means the stage count is the builder's automatic smem carve-out. Two fp8-only flags (the
  scaled_mm_fp8 family): ``_fa`` fast accumulation (CUTLASS's ``*FP8FastAccum`` schedules: the wgmma accumulator
  is never promoted to full fp32), ``_swab`` swap-AB (the kernel computes ``D^T = W . A^T``: the tile's M runs
  over the GEMM's N, its N over the tokens; for few tokens). ``_z{n}`` (n in 2, 4, 8; omitted at 1): the persistent
  tile scheduler's ``max_swizzle_size`` — CTAs walk the output tiles in stripes n tiles wide, so one wave reads
  fewer distinct A rows / W columns (L2 reuse on large problems); it orders the tiles, never a tile's sums.
* Depthwise conv1d direct kernel (the conv1d family, ``templates/conv1d_depthwise.cu.j2``):
  ``dw{T}x{C}_v{vec}_n{threads}`` — a CTA computes a tile of T frames x C channels, moves ``vec``-element
  vectors along the contiguous dim, and runs ``threads`` threads. Every field is always written (no defaults);
  as a `Config`: ``tile=(T, C, 1)``, ``kernel_schedule="depthwise"``, ``alignment=vec``, ``threads``.
* Direct conv2d kernel for a few input channels (the conv2d_activation family, ``templates/conv2d_direct.cu.j2``):
  ``dc{P}x{C}_v{vec}_n{threads}`` — a CTA computes P output positions (of M = B x H_out x W_out) x C output
  channels, stores ``vec``-element vectors along the (contiguous) channels, runs ``threads`` threads. As a
  `Config`: ``tile=(P, C, 1)``, ``kernel_schedule="direct"``, ``alignment=vec``, ``threads``.

Nothing here is computed at import time from the environment; a lane's config space is a literal list.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

# Sentinels a DB region or the `config=` argument may name instead of a concrete id.
#   default   the lane's GEMM_DEFAULT config
#   torch     cuBLAS (torch.mm / addmm) followed by an eager activation
#   fused     cuBLASLt with bias+activation fused in its epilogue (torch._addmm_activation); torch where N/A
#   heuristic the family's untuned shape heuristic (scaled_mm families)
SENTINELS: tuple[str, ...] = ("default", "torch", "fused", "heuristic")
AUTO = "auto"

SCHEDULES_2X = ("multistage",)
SCHEDULES_3X = ("cooperative", "pingpong", "streamk", "warpspecialized")
SCHEDULES_DW = ("depthwise",)
SCHEDULES_DC = ("direct",)
SWIZZLES = (1, 2, 4, 8)  # CUTLASS's persistent scheduler rounds max_swizzle_size down to a power of two <= 8
_SCHED_SHORT = {"cooperative": "coop", "pingpong": "pp", "streamk": "sk", "warpspecialized": "ws"}
_SCHED_LONG = {v: k for k, v in _SCHED_SHORT.items()}
# The epilogue schedule is fixed by the kernel schedule for the TMA epilogues we emit; it is still an explicit
# field so a DB file records it and a future lane can differ.
EPILOGUE_FOR_KERNEL = {
    "multistage": "default",
    "cooperative": "tma_cooperative",
    "pingpong": "tma",
    "warpspecialized": "tma",
    "streamk": "tma_cooperative",
    "depthwise": "direct",
    "direct": "direct",
}

# ASCII digits only (``\d`` would take any Unicode digit); matched with fullmatch (``$`` allows a final newline).
_ID_2X = re.compile(r"b([0-9]+)x([0-9]+)x([0-9]+)_w([0-9]+)x([0-9]+)x([0-9]+)_s([0-9]+)(?:_k([0-9]+))?(?:_a([0-9]+))?")
_ID_3X = re.compile(r"t([0-9]+)x([0-9]+)x([0-9]+)_c([0-9]+)x([0-9]+)_(coop|pp|sk|ws)(?:_s([0-9]+))?(?:_a([0-9]+))?"
                    r"(?:_z([0-9]+))?(_fa)?(_swab)?")
_ID_DW = re.compile(r"dw([1-9][0-9]*)x([1-9][0-9]*)_v([1-9][0-9]*)_n([1-9][0-9]*)")
_ID_DC = re.compile(r"dc([1-9][0-9]*)x([1-9][0-9]*)_v([1-9][0-9]*)_n([1-9][0-9]*)")
_MAX_ID_LEN = 64
# Depthwise-conv config bounds: what the template's thread mapping supports (outputs per thread R =
# T * C / threads, 1..32, and a whole number of them per frame column).
DW_VECS = (1, 2, 4, 8, 16)
DW_THREADS = (32, 64, 128, 256, 512, 1024)
DW_MAX_KW = 31
# Direct conv2d bounds: input channels x filter taps a CTA stages per position (the kernel's patch), and the
# outputs per thread (vec-element vectors x positions).
DC_MAX_K = 4 * 7 * 7
DC_VECS = (1, 2, 4, 8)


class ConfigError(ValueError):
    """A config id or parameter set that is not part of the config space."""


@dataclass(frozen=True)
class Config:
    tile: tuple[int, int, int]
    kernel_schedule: str
    warp: tuple[int, int, int] | None = None  # 2.x only: the warp tile
    stages: int = 0  # 0 = automatic carve-out (3.x only)
    cluster: tuple[int, int, int] = (1, 1, 1)
    split_k: int = 1
    alignment: int = 8
    epilogue_schedule: str = field(default="")
    threads: int = 0  # depthwise only: threads per CTA (0 for the GEMM generations, omitted from to_dict)
    fast_accum: bool = False  # 3.x fp8 only: FP8FastAccum schedule (omitted from to_dict when False)
    swap_ab: bool = False  # 3.x fp8 only: D^T = W . A^T (omitted from to_dict when False)
    swizzle: int = 1  # 3.x only: the tile scheduler's max_swizzle_size (omitted from to_dict at 1)

    def __post_init__(self) -> None:
        if not self.epilogue_schedule:
            object.__setattr__(self, "epilogue_schedule", EPILOGUE_FOR_KERNEL.get(self.kernel_schedule, ""))
        _validate(self)

    @property
    def generation(self) -> str:
        """``"2x"`` (mma.sync multistage), ``"3x"`` (TMA warp-specialized), ``"dw"`` (depthwise conv1d) or ``"dc"``
        (direct conv2d)."""
        if self.kernel_schedule == "depthwise":
            return "dw"
        if self.kernel_schedule == "direct":
            return "dc"
        return "2x" if self.kernel_schedule == "multistage" else "3x"

    @property
    def id(self) -> str:
        m, n, k = self.tile
        if self.generation == "dw":
            return f"dw{m}x{n}_v{self.alignment}_n{self.threads}"
        if self.generation == "dc":
            return f"dc{m}x{n}_v{self.alignment}_n{self.threads}"
        if self.generation == "2x":
            wm, wn, wk = self.warp  # type: ignore[misc]
            s = f"b{m}x{n}x{k}_w{wm}x{wn}x{wk}_s{self.stages}"
            if self.split_k != 1:
                s += f"_k{self.split_k}"
        else:
            s = f"t{m}x{n}x{k}_c{self.cluster[0]}x{self.cluster[1]}_{_SCHED_SHORT[self.kernel_schedule]}"
            if self.stages:
                s += f"_s{self.stages}"
        if self.alignment != 8:
            s += f"_a{self.alignment}"
        if self.swizzle != 1:
            s += f"_z{self.swizzle}"
        if self.fast_accum:
            s += "_fa"
        if self.swap_ab:
            s += "_swab"
        return s

    @property
    def warp_count(self) -> tuple[int, int, int]:
        if self.generation in ("dw", "dc"):
            return (self.threads // 32, 1, 1)
        if self.generation == "2x":
            return tuple(t // w for t, w in zip(self.tile, self.warp))  # type: ignore[return-value]
        # 3.x: consumer warpgroups (4 warps each) as CUTLASS's TileDescription expects them.
        return (2, 1, 1) if self.kernel_schedule in ("cooperative", "streamk") else (1, 1, 1)

    def kernel_key(self) -> "Config":
        """The part of a config that selects a compiled kernel: split-K is a launch argument, not code."""
        if self.split_k == 1:
            return self
        return Config(**{**_fields(self), "split_k": 1})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tile"], d["cluster"] = list(self.tile), list(self.cluster)
        d["warp"] = list(self.warp) if self.warp else None
        if not self.threads:
            del d["threads"]  # the GEMM generations' DB tables stay as they were
        for flag in ("fast_accum", "swap_ab"):
            if not d[flag]:
                del d[flag]
        if self.swizzle == 1:
            del d["swizzle"]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Config":
        try:
            return Config(
                tile=tuple(int(x) for x in d["tile"]),  # type: ignore[arg-type]
                kernel_schedule=str(d["kernel_schedule"]),
                warp=tuple(int(x) for x in d["warp"]) if d.get("warp") else None,  # type: ignore[arg-type]
                stages=int(d.get("stages", 0)),
                cluster=tuple(int(x) for x in d.get("cluster", (1, 1, 1))),  # type: ignore[arg-type]
                split_k=int(d.get("split_k", 1)),
                alignment=int(d.get("alignment", 8)),
                epilogue_schedule=str(d.get("epilogue_schedule", "")),
                threads=int(d.get("threads", 0)),
                fast_accum=_flag(d, "fast_accum"),
                swap_ab=_flag(d, "swap_ab"),
                swizzle=int(d.get("swizzle", 1)),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"malformed config parameters {d!r}: {e}") from None


def _flag(d: dict[str, Any], name: str) -> bool:
    v = d.get(name, False)
    if not isinstance(v, bool):
        raise ConfigError(f"{name} must be true or false, got {v!r}")
    return v


def _fields(c: Config) -> dict[str, Any]:
    return {f: getattr(c, f) for f in c.__dataclass_fields__}


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _validate_dw(c: Config) -> None:
    """The depthwise generation's rules (a branch of its own: the GEMM rules below never see such a config)."""
    tt, tc, one = c.tile if len(c.tile) == 3 else (0, 0, 0)
    if not (all(isinstance(x, int) for x in c.tile) and one == 1 and 8 <= tt <= 512 and 8 <= tc <= 512
            and _pow2(tt) and _pow2(tc)):
        raise ConfigError(f"depthwise tile {c.tile} must be (T, C, 1) with T, C powers of two in 8..512")
    if c.alignment not in DW_VECS:
        raise ConfigError(f"depthwise vector width {c.alignment} not in {DW_VECS}")
    if c.threads not in DW_THREADS:
        raise ConfigError(f"depthwise threads {c.threads} not in {DW_THREADS}")
    if c.epilogue_schedule != EPILOGUE_FOR_KERNEL["depthwise"]:
        raise ConfigError(f"epilogue schedule {c.epilogue_schedule!r} does not go with 'depthwise'")
    if c.warp is not None or c.stages or c.cluster != (1, 1, 1) or c.split_k != 1:
        raise ConfigError("a depthwise config has no warp tile, stages, cluster or split-K")
    work = tt * tc
    if work % c.threads or not (1 <= work // c.threads <= 32) or tt % (work // c.threads):
        raise ConfigError(f"depthwise tile {tt}x{tc} with {c.threads} threads: each thread must own 1..32 "
                          "consecutive frames of one channel (T * C / threads dividing T)")
    if tc % c.alignment or tt % c.alignment:
        raise ConfigError(f"depthwise tile {tt}x{tc} is not a whole number of {c.alignment}-element vectors")


def _validate_dc(c: Config) -> None:
    """The direct conv2d generation's rules: whole vectors of channels, 1..32 vectors per thread, and the
    positions x channel-vectors of a tile divisible over the threads (templates/conv2d_direct.cu.j2's mapping)."""
    p, tc, one = c.tile if len(c.tile) == 3 else (0, 0, 0)
    if not (all(isinstance(x, int) for x in c.tile) and one == 1 and 1 <= p <= 512 and 8 <= tc <= 512
            and _pow2(p) and _pow2(tc)):
        raise ConfigError(f"direct conv tile {c.tile} must be (P, C, 1) with P in 1..512, C in 8..512, powers of two")
    if c.alignment not in DC_VECS or tc % c.alignment:
        raise ConfigError(f"direct conv vector width {c.alignment} must be in {DC_VECS} and divide the channel tile")
    if c.threads not in DW_THREADS:
        raise ConfigError(f"direct conv threads {c.threads} not in {DW_THREADS}")
    if c.epilogue_schedule != EPILOGUE_FOR_KERNEL["direct"]:
        raise ConfigError(f"epilogue schedule {c.epilogue_schedule!r} does not go with 'direct'")
    if c.warp is not None or c.stages or c.cluster != (1, 1, 1) or c.split_k != 1:
        raise ConfigError("a direct conv config has no warp tile, stages, cluster or split-K")
    groups = tc // c.alignment  # channel vectors per position
    if c.threads % groups or p % (c.threads // groups) or not (1 <= p // (c.threads // groups) <= 32):
        raise ConfigError(f"direct conv tile {p}x{tc} v{c.alignment} with {c.threads} threads: the threads must "
                          "split into whole position rows of channel vectors, each thread owning 1..32 positions")


def _validate(c: Config) -> None:
    if (c.fast_accum or c.swap_ab) and c.kernel_schedule not in SCHEDULES_3X:
        raise ConfigError("fast accumulation and swap-AB are 3.x (wgmma) config flags")
    if c.swizzle not in SWIZZLES or (c.swizzle != 1 and c.kernel_schedule not in SCHEDULES_3X):
        raise ConfigError(f"swizzle {c.swizzle!r} not supported (one of {SWIZZLES}; other than 1 for 3.x only)")
    if c.kernel_schedule in SCHEDULES_DW:
        _validate_dw(c)
        return
    if c.kernel_schedule in SCHEDULES_DC:
        _validate_dc(c)
        return
    if c.threads:
        raise ConfigError("only depthwise and direct conv configs have a thread count")
    if len(c.tile) != 3 or not all(isinstance(x, int) and 8 <= x <= 512 for x in c.tile):
        raise ConfigError(f"tile {c.tile} out of range")
    if c.kernel_schedule not in SCHEDULES_2X + SCHEDULES_3X:
        raise ConfigError(f"unknown kernel schedule {c.kernel_schedule!r}")
    if c.epilogue_schedule != EPILOGUE_FOR_KERNEL[c.kernel_schedule]:
        raise ConfigError(f"epilogue schedule {c.epilogue_schedule!r} does not go with {c.kernel_schedule!r}")
    if c.alignment not in (1, 2, 4, 8, 16):
        raise ConfigError(f"alignment {c.alignment} not supported")
    if not (1 <= c.split_k <= 64):
        raise ConfigError(f"split_k {c.split_k} out of range")
    if c.generation == "2x":
        if c.warp is None or len(c.warp) != 3 or not all(isinstance(x, int) and x > 0 for x in c.warp):
            raise ConfigError(f"a 2.x config needs a positive warp tile, got {c.warp}")  # (a 0 divided below)
        if any(t % w for t, w in zip(c.tile, c.warp)) or c.warp[2] != c.tile[2]:
            raise ConfigError(f"warp tile {c.warp} does not divide threadblock tile {c.tile} (warp K == tile K)")
        nwarps = (c.tile[0] // c.warp[0]) * (c.tile[1] // c.warp[1])
        if nwarps not in (1, 2, 4, 8):
            raise ConfigError(f"{nwarps} warps per threadblock not supported")
        if not (2 <= c.stages <= 8):
            raise ConfigError(f"2.x stages must be 2..8, got {c.stages}")
        if c.cluster != (1, 1, 1):
            raise ConfigError("2.x configs have no cluster")
    else:
        if c.warp is not None:
            raise ConfigError("a 3.x config has no warp tile (it is derived from the schedule)")
        if c.split_k != 1:
            raise ConfigError("3.x configs split K through Stream-K, not split_k")
        if c.cluster[2] != 1 or not (_pow2(c.cluster[0]) and _pow2(c.cluster[1])) or c.cluster[0] * c.cluster[1] > 8:
            raise ConfigError(f"cluster {c.cluster} not supported")
        if c.kernel_schedule == "warpspecialized" and c.tile[0] * c.tile[1] > 128 * 128:
            raise ConfigError(f"tile {c.tile}: one consumer warpgroup holds at most 128 x 128 fp32 accumulators")
        if c.kernel_schedule in ("cooperative", "streamk") and c.tile[0] < 128:
            raise ConfigError("cooperative schedules need tile M >= 128 (two consumer warpgroups)")
        if c.tile[0] % 64 or c.tile[1] % 16:
            raise ConfigError(f"wgmma tile {c.tile} must have M % 64 == 0 and N % 16 == 0")
        if c.stages and not (2 <= c.stages <= 8):
            raise ConfigError(f"3.x stages must be 0 (auto) or 2..8, got {c.stages}")


def parse(config_id: str) -> Config:
    """Parse a concrete config id. Raises `ConfigError` for sentinels, junk, ids outside the space's grammar, and
    ids that are not the canonical spelling of their config (the error names the canonical id)."""
    if not isinstance(config_id, str) or len(config_id) > _MAX_ID_LEN:
        raise ConfigError(f"not a config id: {str(config_id)[:_MAX_ID_LEN]!r}")
    if config_id in SENTINELS or config_id == AUTO:
        raise ConfigError(f"{config_id!r} is a sentinel, not a concrete config id")
    m = _ID_2X.fullmatch(config_id)
    if m:
        g = [int(x) if x else None for x in m.groups()]
        c = Config(tile=(g[0], g[1], g[2]), warp=(g[3], g[4], g[5]), stages=g[6],
                   kernel_schedule="multistage", split_k=1 if g[7] is None else g[7],
                   alignment=8 if g[8] is None else g[8])
    elif (m := _ID_DW.fullmatch(config_id)):
        tt, tc, vec, threads = (int(x) for x in m.groups())
        c = Config(tile=(tt, tc, 1), kernel_schedule="depthwise", alignment=vec, threads=threads)
    elif (m := _ID_DC.fullmatch(config_id)):
        p, tc, vec, threads = (int(x) for x in m.groups())
        c = Config(tile=(p, tc, 1), kernel_schedule="direct", alignment=vec, threads=threads)
    else:
        m = _ID_3X.fullmatch(config_id)
        if not m:
            raise ConfigError(f"unknown config id {config_id!r}")
        tm, tn, tk, cm, cn, sched, st, al, sw, fa, swab = m.groups()
        c = Config(tile=(int(tm), int(tn), int(tk)), cluster=(int(cm), int(cn), 1),
                   kernel_schedule=_SCHED_LONG[sched], stages=int(st or 0), alignment=int(al or 8),
                   swizzle=int(sw or 1), fast_accum=bool(fa), swap_ab=bool(swab))
    if c.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical: its config is spelt {c.id!r}")
    return c


def is_sentinel(name: str) -> bool:
    return name in SENTINELS


# ---------------------------------------------------------------------------------------------- lanes
# A lane: a kernel generation with its own config space, default and static feasibility rules (pure data; the
# families declare their lanes, codegen renders them, the runtime checks DB configs against them).
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
        if c.generation == "dw":
            return dw_smem_bytes(c, DW_MAX_KW)
        if c.generation == "dc":  # sized for a 3x3 filter over 4 channels; the launcher checks the real K
            return dc_smem_bytes(c, 4 * 3 * 3)
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
        if c.generation == "dc":
            # N = out channels, K = in channels x taps: a few input channels only (the first conv of a frontend)
            if k is not None and k > DC_MAX_K:
                return f"K={k} exceeds the direct conv's {DC_MAX_K} (in channels x taps)"
            return None if n is None or n % c.alignment == 0 else f"N={n} not a multiple of vector width {c.alignment}"
        if c.generation == "dw":
            # N = channels and K = kernel width: any value runs (a misaligned call uses the kernel's scalar path)
            return None if k is None or (k % 2 and 3 <= k <= DW_MAX_KW) else f"kernel width {k} is not odd 3..31"
        if n is not None and n % c.alignment:
            return f"N={n} not a multiple of alignment {c.alignment}"
        if k is not None:
            if k % c.alignment:
                return f"K={k} not a multiple of alignment {c.alignment}"
            k_tiles = -(-k // c.tile[2])
            if c.split_k > k_tiles:
                return f"split_k={c.split_k} exceeds the {k_tiles} K-tiles of K={k}"
        return None


def dw_smem_bytes(c: Config, kw: int) -> int:
    """An upper bound on a depthwise kernel's dynamic shared memory (templates/conv1d_depthwise.cu.j2 computes the
    exact size): an fp32 input tile of (T + kw - 1 + 2 * vec) x C plus an fp32 output tile of (T + vec) x C (the
    [B, C, T] layout's; [B, T, C] stores from registers), rows padded to odd strides, plus the tile's fp32 filters
    (C x kw)."""
    tt, tc, _ = c.tile
    return 4 * ((tt + kw - 1 + 2 * c.alignment + 1) * tc + (tt + c.alignment + 1) * tc + tc * kw)


def dc_smem_bytes(c: Config, k: int) -> int:
    """A direct conv2d kernel's shared memory (templates/conv2d_direct.cu.j2): fp32 weights [k][C] and the fp32
    input patches [P][k] of its tile."""
    p, tc, _ = c.tile
    return 4 * (k * tc + p * k)
