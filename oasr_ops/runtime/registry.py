"""The kernel-family registry: every family declares itself once, as a `FamilySpec` value (torchao's idea of a
config registered with its handler), and every generic layer — the DB reader, selection, the graph pass, build,
prewarm, prebuild, status, the tuning report — loops over `families()` instead of naming a family.

The registry lives in the runtime layer so that the per-call read path can consult it without importing any
family; the families (``oasr_ops/families/<name>/``) fill it when `oasr_ops.families` is imported (the package's
``__init__`` does that first). A spec holds data the runtime reads (ops, lanes, untuned policy) and callables
that only the layers above call (op registration already happened at import; rewrite matcher, census recorder,
candidate factory, prebuild set). The runtime calls exactly four of them: `heuristic` (the answer of a
``heuristic`` policy's sentinel), `production_extras` and `production_ids` (which concrete ids this process
compiles and may serve) and `render` (whose output the ``impl`` soft validator hashes).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..configs import Config, ConfigError, Lane

# fn(lane, m, n, k, arch) -> config id of `lane`: a family's untuned shape heuristic (arch: the GPU family served,
# e.g. for its SM count; a lane may be native to several).
HeuristicFn = Callable[[Lane, int, int, int, str], str]

POLICIES = ("default", "heuristic", "torch")


@dataclass(frozen=True)
class FamilySpec:
    """One kernel family.

    name:            the DB family (file ``db/sm<arch>/<name>.json``, signatures ``<name>|op=...``).
    ops:             the DB ops (signature ``op=`` values), e.g. ``("gemm", "gemm_activation")``.
    lanes:           the family's lanes (config spaces); the native lane of an arch is the one it measures.
    dtyped:          signatures carry ``dt=half|fp16|bf16`` (the half-precision families) or no dtype.
    exact_points:    entries may hold exact ``"BxT"`` points before regions (conv1d, spec).
    policy:          what an untuned shape gets: ``default`` (the native lane's default config), ``heuristic``
                     (`heuristic`, tier ``heuristic``) or ``torch`` (cuBLAS, tier ``default``).
    no_arch:         the answer where no arch family is known (a CPU without ``OASR_ARCH``).
    streamk_measured_only: a Stream-K config is served only from a measured tier (user/system).
    modelled:        the cost-model tier (runtime/model_tier.py) answers this family's uncovered shapes, ranking
                     its compiled configs against cuBLAS (tier ``model``; OASR_TUNE_MODEL_FALLBACK=0: off).
    wave_guard_dtype: the operand dtype in which the build's wave guard (tune/region_guard.py) models this
                     family's tiles, for a family that is not `modelled` (no cost-model tier) but whose tiles the
                     cost model's structure describes and whose fallback is cuBLAS (scaled_mm_fp8: "fp8"); the
                     guard then calibrates on the signature's own measurements and caps at the anchor
                     (region_guard.calibrated_ratio); None: guarded only when `modelled` (as fp16).
    eager_regions:   the build also writes each entry's ``regions_eager`` (tune/serving_regions.py): the regions a
                     graph compiled without CUDA graphs is served, where a launch-bound tile replaces the torch arm
                     (whose host cost per call is the larger). gemm: its torch arm goes through `oasr::gemm`.
    no_streamk_ops:  ops whose launcher has no Stream-K variant (such an entry falls back, warned once).
    heuristic:       the ``heuristic`` sentinel's answer, wherever it is served (`select.serve_config`, a plan's
                     sentinel expansion); not a tier-chain plug-in, so `select_config` and the region tables a
                     graph bakes keep the sentinel and each call resolves it for its own M.
    production_extras: fn(lane) -> ids the family compiles beyond the generic production rule
                     (`runtime.production`: lane default, coverage basis, DB references); scaled_mm: every tile
                     its heuristic can answer.
    production_ids:  fn(arch) -> the only concrete ids `select.serve_config` may serve (others are warned about
                     once and the policy answers); None: any config of the lane.
    render:          fn(lane, config, dtype) -> the kernel's CUDA source (codegen's renderer; the ``impl`` soft
                     validator hashes it, so the runtime never imports codegen).
    impl_variants:   the kernel variants (the renderer's `dtype` argument) the ``impl`` validator renders each
                     kernel in: the fp16 ones, one per layout where the layout is part of the variant (bmm's B
                     operand, conv1d's bct/btc). A variant the renderer refuses made the hash fall back to every
                     template file of the package: any template edit, in any family, then staled the DB.
    handlers:        the upper layers' hooks, by name (e.g. ``rewrite``, ``census``, ``candidates``,
                     ``prebuild_specs``, ``reset_plans``, ``host_probe``); `handler()` looks one up.
    rewrite_order:   the graph pass runs the ``rewrite`` handlers in ascending order (registration order among
                     equals); conv1d runs first (-1): it changes the layouts, hence the contiguity, that the
                     GEMM matchers see.
    """

    name: str
    ops: tuple[str, ...]
    lanes: tuple[Lane, ...] = ()
    dtyped: bool = True
    exact_points: bool = False
    policy: str = "default"
    no_arch: str = "default"
    streamk_measured_only: bool = False
    modelled: bool = False
    wave_guard_dtype: str | None = None
    eager_regions: bool = False
    no_streamk_ops: tuple[str, ...] = ()
    heuristic: HeuristicFn | None = None
    production_extras: Callable[[Lane], Iterable[str]] | None = None
    production_ids: Callable[[str], frozenset[str]] | None = None
    render: Callable[[Lane, Config, str], str] | None = None
    impl_variants: tuple[str, ...] = ("fp16",)
    handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    rewrite_order: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"family {self.name}: policy must be one of {POLICIES}, got {self.policy!r}")
        if not self.ops:
            raise ValueError(f"family {self.name}: no ops")

    @property
    def fallback_tier(self) -> str:
        return "heuristic" if self.policy == "heuristic" else "default"

    def handler(self, name: str) -> Callable[..., Any] | None:
        return self.handlers.get(name)

    def native_lane(self, arch: str) -> Lane | None:
        return next((lane for lane in self.lanes if arch in lane.native_for), None)

    def lanes_for(self, arch: str) -> list[Lane]:
        """Lanes whose kernels run on `arch`, the native one first."""
        native = self.native_lane(arch)
        others = [lane for lane in self.lanes if arch in lane.arch_families and lane is not native]
        return ([native] if native else []) + others


_LOCK = threading.Lock()
_FAMILIES: dict[str, FamilySpec] = {}
_LANES: dict[str, Lane] = {}
LANES = _LANES  # the live name -> lane map (read-only for callers)


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family (once; registering the same name twice is an error unless it is the same object)."""
    with _LOCK:
        old = _FAMILIES.get(spec.name)
        if old is not None and old is not spec:
            raise ValueError(f"kernel family {spec.name!r} is already registered")
        for lane in spec.lanes:
            if lane.family != spec.name:
                raise ValueError(f"lane {lane.name} serves {lane.family!r}, not {spec.name!r}")
            if lane.name in _LANES and _LANES[lane.name] is not lane:
                raise ValueError(f"lane {lane.name!r} is already registered")
        _FAMILIES[spec.name] = spec
        for lane in spec.lanes:
            _LANES[lane.name] = lane
    return spec


def families() -> dict[str, FamilySpec]:
    """Every registered family by name (registration order)."""
    return dict(_FAMILIES)


def get(name: str) -> FamilySpec:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known: {sorted(_FAMILIES)}") from None


def lanes() -> dict[str, Lane]:
    """Every lane of every family, by name."""
    return dict(_LANES)


def get_lane(name: str) -> Lane:
    try:
        return _LANES[name]
    except KeyError:
        raise ValueError(f"unknown lane {name!r}; known: {sorted(_LANES)}") from None


def native_lane(arch_family: str, family: str = "gemm") -> Lane | None:
    """The lane a GPU family measures and serves `family` with by default (None if no lane runs there)."""
    spec = _FAMILIES.get(family)
    return spec.native_lane(arch_family) if spec is not None else None


def lanes_for(arch_family: str, family: str = "gemm") -> list[Lane]:
    spec = _FAMILIES.get(family)
    return spec.lanes_for(arch_family) if spec is not None else []


def lane_of(config: Config, arch_family: str, family: str = "gemm") -> Lane:
    """The lane of `family` whose space holds `config` and runs on `arch_family`; ConfigError if none does."""
    for lane in lanes_for(arch_family, family):
        if config in lane.space:
            return lane
    raise ConfigError(f"config {config.id} is in no {family} lane that runs on {arch_family}")
