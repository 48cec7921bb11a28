"""What every op family's CUDA path shares: plans (how one call key runs, made once), the region tables a
compiled graph bakes into an op's ``config`` string, the ``config`` argument's check, and warn-once.

The per-call hot path of an op is one dict lookup in `PlanCache.plans` keyed by (config, dtypes, shape, epilogue,
device, DB epoch); a miss makes the plan under a lock (selection, kernel load, feasibility) exactly once.
"""
from __future__ import annotations

import functools
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable

from ..configs import AUTO, SENTINELS, Config, ConfigError, parse

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
        self._lock = threading.Lock()

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

    def __call__(self, key, msg: str, category: type[Warning] = UserWarning) -> None:
        if key not in self._seen:
            self._seen.add(key)
            warnings.warn(msg, category, stacklevel=3)

    def clear(self) -> None:
        self._seen.clear()


def check_config_arg(config: str, op: str = "gemm", check_id: Callable[[Config], str | None] | None = None) -> None:
    """ValueError (naming `oasr.<op>`) unless `config` is auto, a sentinel, a parseable id or a well-formed region
    table; `check_id(cfg)` says why a parsed id is not one of the op's family (None: it is). Shared by every op."""
    if not isinstance(config, str):
        raise ValueError(f"oasr.{op}: config must be a string")
    if config == AUTO or config in SENTINELS:
        return
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


# ---------------------------------------------------------------------------------- region tables baked into graphs

def format_table(regions: list[tuple[int | None, str]]) -> str:
    parts = [f"{'*' if hi is None else int(hi)}={cfg}" for hi, cfg in regions]
    return _TABLE_PREFIX + ";".join(parts)


@functools.lru_cache(maxsize=4096)
def parse_table(table: str) -> tuple[tuple[int | None, str], ...]:
    if not table.startswith(_TABLE_PREFIX):
        raise ValueError(f"not a region table: {table!r}")
    out: list[tuple[int | None, str]] = []
    for part in table[len(_TABLE_PREFIX):].split(";"):
        hi, sep, cfg = part.partition("=")
        if not sep:
            raise ValueError(f"malformed region {part!r} in {table!r}")
        if cfg not in SENTINELS:
            try:
                parse(cfg)
            except ConfigError as e:
                raise ValueError(f"region table names unknown config {cfg!r}: {e}") from None
        out.append((None if hi == "*" else int(hi), cfg))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def resolve_table(table: str, m: int) -> str:
    """Round-up: the first region with m_hi >= M; `*` is the catch-all; past the end -> `auto`."""
    for hi, cfg in parse_table(table):
        if hi is None or m <= hi:
            return cfg
    return AUTO


