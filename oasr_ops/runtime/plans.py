"""What every op family's CUDA path shares: plans (how one call key runs, made once), the plan skeleton, the
region tables a compiled graph bakes into an op's ``config`` string, the ``config`` argument's check, and
warn-once.

The per-call hot path of an op is one dict lookup in `PlanCache.plans` keyed by (config, dtypes, shape, epilogue,
device, DB epoch); a miss makes the plan under a lock (selection, kernel load, feasibility) exactly once.

`make_plan` is the skeleton of every family's plan: the ``config`` argument -> (a baked table's row for M) ->
(``auto``: the family's selection) -> a sentinel expanded (`expand_sentinel`) -> a concrete id -> the family's
kernel launcher, or its torch path (for a sentinel, or where the kernel cannot serve). A family supplies only the
selection call, the launcher and the torch path.
"""
from __future__ import annotations

import functools
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..configs import AUTO, SENTINELS, Config, ConfigError, parse

if TYPE_CHECKING:  # annotations only: the runtime layer does not import torch for them
    import torch
from . import registry as _registry

TABLE_PREFIX = "regions:"
_TABLE_PREFIX = TABLE_PREFIX  # old spelling


@dataclass
class Plan:
    """How one (config, shape, epilogue) call runs. `config` is what served it (an id or a sentinel)."""

    config: str
    tier: str
    signature: str
    run: Callable[..., torch.Tensor] = field(repr=False)
    calls: int = 0


class PlanCache:
    """Plans by key, shared by every op family. `plans` is the dict an op's hot path reads directly (one lookup
    per call); `get_or_make` builds a missing plan once under a lock."""

    def __init__(self) -> None:
        self.plans: dict[tuple, Plan] = {}
        self._lock = threading.RLock()  # re-entrant: autotune() times other configs' plans inside a make()

    def get_or_make(self, key: tuple, make: Callable[[], Plan]) -> Plan:
        plan = self.plans.get(key)
        if plan is None:
            with self._lock:
                plan = self.plans.get(key)
                if plan is None:
                    plan = make()
                    self.plans[key] = plan
        return plan

    def served(self) -> list[Plan]:
        return [p for p in self.plans.values() if p.calls]

    def clear(self) -> None:
        with self._lock:
            self.plans.clear()  # the same dict: the ops' aliases stay valid



class WarnOnce:
    """`warnings.warn` each distinct key once per process (a family's kernel-fallback notices)."""

    def __init__(self) -> None:
        self._seen: set = set()

    def __call__(self, key, msg: str | None = None, category: type[Warning] = UserWarning) -> None:
        """Warn `msg` (default: `key` itself, a message deduplicated by its text) unless `key` was seen."""
        if key not in self._seen:
            self._seen.add(key)
            warnings.warn(key if msg is None else msg, category, stacklevel=3)

    def clear(self) -> None:
        self._seen.clear()


# (config, op, check_id) that passed `check_config_arg`: ops whose hot path checks the config on every call (a baked
# region table names several ids, each parsed and validated: ~30 us per call on a 2-core host before this memo).
# Bounded: a process sees few distinct config strings (one per graph site at most); past the bound it stops adding.
_CONFIGS_OK: set[tuple] = set()
_CONFIGS_OK_MAX = 65536


@functools.lru_cache(maxsize=None)
def lane_check(family: str, label: str | None = None) -> Callable[[Config], str | None]:
    """The `check_id` of a family's ops: None when some lane of `family` holds the config, on any arch (the CPU and
    the fake cannot know the GPU's), else ``is in no <label> lane``. One function object per (family, label), so
    `check_config_arg`'s memo key is stable."""
    def check(cfg: Config) -> str | None:
        if any(cfg in lane.space for lane in _registry.lanes().values() if lane.family == family):
            return None
        return f"is in no {label or family} lane"
    return check


def check_config_arg(config: str, op: str = "gemm", check_id: Callable[[Config], str | None] | None = None) -> None:
    """ValueError (naming `oasr.<op>`) unless `config` is auto, a sentinel, a parseable id or a well-formed region
    table; `check_id(cfg)` says why a parsed id is not one of the op's family (None: it is). Shared by every op.
    A string that passed once passes again at the cost of a set lookup (the checks are pure functions of it)."""
    if not isinstance(config, str):
        raise ValueError(f"oasr.{op}: config must be a string")
    if config == AUTO or config in SENTINELS:
        return
    key = (config, op, check_id)
    if key in _CONFIGS_OK:
        return
    _check_config_string(config, op, check_id)
    if len(_CONFIGS_OK) < _CONFIGS_OK_MAX:
        _CONFIGS_OK.add(key)


def _check_config_string(config: str, op: str, check_id: Callable[[Config], str | None] | None) -> None:
    if config.startswith(_TABLE_PREFIX):
        try:
            ids = [cid for _hi, cid in parse_table(config) if cid not in SENTINELS]
        except ValueError as e:
            raise ValueError(f"oasr.{op}: {e}") from None
    else:
        ids = [config]
    for cid in ids:
        try:
            cfg = parse(cid)
        except ConfigError as e:
            raise ValueError(f"oasr.{op}: unknown config {cid!r}: {e}") from None
        why = check_id(cfg) if check_id is not None else None
        if why:
            raise ValueError(f"oasr.{op}: config {cid!r} {why}")


# ---------------------------------------------------------------------------------- the plan skeleton

Run = Callable[..., Any]


def resolve_config_arg(config: str, m: int, select: Callable[[], Any]) -> tuple[str, str]:
    """(config, tier) of an op's ``config`` argument for a call of M rows: a baked table's row (tier ``baked``),
    then ``auto`` -> `select()` (a `select.Selection`; its tier), else the argument itself (tier ``explicit``)."""
    tier = "explicit"
    if config.startswith(_TABLE_PREFIX):
        config, tier = resolve_table(config, m), "baked"
    if config == AUTO:
        sel = select()
        config, tier = sel.config, sel.tier
    return config, tier


def expand_sentinel(family: str, config: str, m: int, n: int, k: int, arch: str) -> str:
    """``default`` -> the native lane's default; ``heuristic`` -> the family's heuristic tile (`spec.heuristic`,
    where it has one); either -> ``torch`` where no lane of the family runs on `arch`; anything else unchanged.
    (No serving rule applies: an explicit or baked id was chosen by the caller.)"""
    if config not in ("default", "heuristic"):
        return config
    spec = _registry.get(family)
    if config == "heuristic" and spec.heuristic is None:
        return config  # the family serves the sentinel itself (with torch)
    lane = spec.native_lane(arch)
    if lane is None:
        return "torch"
    return lane.default.id if config == "default" else spec.heuristic(lane, m, n, k, arch)


def make_plan(family: str, config: str, m: int, n: int, k: int, arch: str, sig: str, *,
              select: Callable[[], Any], torch_run: Callable[[str], Run],
              kernel_run: Callable[[Config], Run | None], keep_sentinel: bool = False) -> Plan:
    """The plan of one call key (module docstring). `torch_run(sentinel)` makes the torch path (``torch`` when a
    kernel cannot serve); `kernel_run(cfg)` the launcher, or None (it warned) to fall back to torch. The plan of a
    sentinel is named ``torch``, or the sentinel itself with `keep_sentinel` (gemm: ``fused`` is a cuBLASLt
    epilogue)."""
    config, tier = resolve_config_arg(config, m, select)
    config = expand_sentinel(family, config, m, n, k, arch)
    if config in SENTINELS:
        return Plan(config if keep_sentinel else "torch", tier, sig, torch_run(config))
    cfg = parse(config)
    run = kernel_run(cfg)
    if run is None:
        return Plan("torch", tier, sig, torch_run("torch"))
    return Plan(cfg.id, tier, sig, run)


# ---------------------------------------------------------------------------------- region tables baked into graphs

_BOUND_RE = re.compile(r"[1-9][0-9]{0,18}")  # a positive M bound, one spelling (no sign, zeros, spaces, `_`)


def format_table(regions: list[tuple[int | None, str]]) -> str:
    """The ``regions:`` string of a round-up table: ``regions:512=<cfg>;2048=<cfg>;*=torch``. ValueError on what
    `parse_table` would reject (so every table written can be read back: ``format_table(parse_table(t)) == t``)."""
    parts = [f"{'*' if hi is None else int(hi)}={cfg}" for hi, cfg in regions]
    table = _TABLE_PREFIX + ";".join(parts)
    parse_table(table)
    return table


def _table_error(table: str, why: str) -> ValueError:
    shown = table if len(table) <= 200 else table[:197] + "..."
    return ValueError(f"region table {shown!r}: {why}")


@functools.lru_cache(maxsize=4096)
def parse_table(table: str) -> tuple[tuple[int | None, str], ...]:
    """``regions:<m_hi>=<cfg>;...;*=<cfg>`` -> ((m_hi, cfg), ...). Bounds are positive, strictly increasing integers;
    ``*`` (the catch-all) is optional and, when present, last; every config is a sentinel or a canonical id.
    Without a catch-all, an M above the last bound resolves to ``auto``. ValueError naming the table otherwise."""
    if not isinstance(table, str) or not table.startswith(_TABLE_PREFIX):
        raise ValueError(f"not a region table: {table!r:.200}")
    body = table[len(_TABLE_PREFIX):]
    if not body:
        raise _table_error(table, "no regions")
    out: list[tuple[int | None, str]] = []
    last = 0
    for i, part in enumerate(body.split(";")):
        hi, sep, cfg = part.partition("=")
        if not sep or not cfg:
            raise _table_error(table, f"region {i} {part!r:.80} is not <m_hi>=<config>")
        if out and out[-1][0] is None:
            raise _table_error(table, f"region {i} follows the catch-all '*' (it must be last)")
        if hi == "*":
            bound = None
        elif _BOUND_RE.fullmatch(hi):
            bound = int(hi)
            if bound <= last:
                raise _table_error(table, f"bound {bound} does not increase (after {last})")
            last = bound
        else:
            raise _table_error(table, f"bound {hi!r:.40} is not a positive integer or '*'")
        if cfg not in SENTINELS:
            try:
                parse(cfg)
            except ConfigError as e:
                raise _table_error(table, f"unknown config {cfg!r:.80}: {e}") from None
        out.append((bound, cfg))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def resolve_table(table: str, m: int) -> str:
    """Round-up: the first region with m_hi >= M; `*` is the catch-all; past the end -> `auto`."""
    for hi, cfg in parse_table(table):
        if hi is None or m <= hi:
            return cfg
    return AUTO


