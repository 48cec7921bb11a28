"""The production set: the configs a process compiles ahead of time (prebuild, prewarm) and, for a family whose
spec sets `production_ids`, the only ones selection serves. One rule for every family:

* the lane default and the lane's coverage basis (so an untuned shape always has a built kernel);
* every concrete id the tuning DB's tiers reference for (family, arch) (what a tuned shape will ask for);
* the family's extras (`FamilySpec.production_extras`, e.g. every tile the int8 heuristic can answer);
* ``OASR_GEMM_COMPILE_SET=all``: the whole lane.

`production_ids(family, arch)` is the serving rule's set, memoised per (DB epoch, arch, OASR_GEMM_COMPILE_SET).
"""
from __future__ import annotations

import os
import threading
import warnings

from .. import env as _env
from ..configs import Config, ConfigError, Lane, parse
from . import database, registry


def compile_all() -> bool:
    """``OASR_GEMM_COMPILE_SET=all``: every config of the lane is in the production set."""
    return _env.compile_set() == "all"


def _db_referenced(arch_family: str, family: str) -> list[str]:
    try:
        return list(database.referenced_configs(family, arch_family))
    except Exception as e:  # a broken DB must never stop kernels from being built
        warnings.warn(f"oasr: could not read the tuning DB's config references: {e}", stacklevel=3)
        return []


def production_configs(lane: Lane, arch_family: str) -> list[Config]:
    """The production set of `lane` on `arch_family` (module docstring), default first, then the coverage basis,
    the DB's references and the family's extras, each once."""
    if compile_all():
        return list(lane.space)
    chosen: list[Config] = [lane.default, *lane.coverage_basis]
    spec = registry.families().get(lane.family)
    extras = list(spec.production_extras(lane)) if spec is not None and spec.production_extras else []
    for cid in _db_referenced(arch_family, lane.family) + extras:
        try:
            c = parse(cid)
        except ConfigError:
            continue
        if c in lane.space and c not in chosen:
            chosen.append(c)
    return chosen


def family_production_configs(family: str, arch_family: str) -> list[Config]:
    """The production set of `family`'s native lane on `arch_family` ([] where no lane of it runs there)."""
    lane = registry.native_lane(arch_family, family)
    return [] if lane is None else production_configs(lane, arch_family)


def prebuild_choice(lane: Lane, arch_family: str, all_: bool, configs: list[Config] | None = None) -> list[Config]:
    """What `oasr tune prebuild` compiles of `lane`: the given `configs` that are in it, else its whole space
    (`all_`), else its family's production set."""
    if configs is not None:
        return [c for c in configs if c in lane.space]
    return list(lane.space) if all_ else production_configs(lane, arch_family)


_LOCK = threading.Lock()
_IDS: dict[tuple, frozenset[str]] = {}


def production_ids(family: str, arch_family: str) -> frozenset[str]:
    """The ids of `family_production_configs`, memoised (a spec's `production_ids` is this, bound to the family)."""
    key = (family, database.epoch(), arch_family, os.environ.get("OASR_GEMM_COMPILE_SET", ""))
    ids = _IDS.get(key)
    if ids is None:
        ids = frozenset(c.id for c in family_production_configs(family, arch_family))
        with _LOCK:
            _IDS[key] = ids
    return ids


def reset() -> None:
    """Forget the memoised sets (tests; a reload does it too)."""
    with _LOCK:
        _IDS.clear()


database.on_reload(lambda _epoch: reset())
