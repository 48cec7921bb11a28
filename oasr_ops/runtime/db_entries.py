"""Validating tuning-DB entries: `Entry` (one validated signature's regions/points), `parse_entry`, and
`Entries`, the lazy signature -> Entry mapping a loaded file serves lookups from (see `db_files`).

Problems are collected per file by `Problems`, which warns at most once per file with the count and the first
`MAX_PROBLEMS_WARNED` reasons.
"""
from __future__ import annotations

import gc
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from ..configs import SENTINELS, Config, ConfigError, parse
from . import registry as _registry
from .db_signatures import parse_signature

MAX_DEPTH = 32  # levels of nesting from the document's top; a well-formed file has 6
MAX_PROBLEMS_WARNED = 3  # reasons quoted in a file's one warning
_POINT_RE = re.compile(r"([1-9][0-9]{0,8})x([1-9][0-9]{0,8})")  # one spelling: no zeros, no newline
_MAX_M = 1 << 62


@dataclass(frozen=True)
class Entry:
    """One validated entry. A region config of None is a hole (a skipped region): its M falls through."""

    signature: str
    regions: tuple[tuple[int | None, str | None], ...]
    points: Mapping[str, str] = field(default_factory=dict)
    soft: dict[str, Any] | None = None  # the entry's own validators, when it carries them
    source: str | None = None
    # The regions a graph compiled without CUDA graphs is served (tune/serving_regions.py); None: `regions`.
    regions_eager: tuple[tuple[int | None, str | None], ...] | None = None

    def lookup(self, m: int) -> str | None:
        """Round-up region lookup; None when no region covers M (or M lands in a hole)."""
        for m_hi, cfg in self.regions:
            if m_hi is None or m_hi >= m:
                return cfg
        return None

    def lookup_point(self, batch: int, t: int, m: int | None = None) -> str | None:
        """Conv1D: the exact point ``"BxT"`` if measured, else the regions at M (default B*T)."""
        cfg = self.points.get(f"{batch}x{t}")
        if cfg is not None:
            return cfg
        return self.lookup(batch * t if m is None else m)

    def breakpoints(self) -> list[int]:
        return [m for m, _ in self.regions if m is not None]


@dataclass
class FileReport:
    """What loading one file did, for `report()` / `oasr tune status`. `entries` and `problems` are complete
    once every entry was validated (`report()` does that); before, they cover the entries looked up so far."""

    path: str
    tier: str
    arch: str
    family: str
    status: str  # "loaded" | "skipped"
    reason: str | None = None
    lane: str | None = None
    entries: int = 0
    problems: list[str] = field(default_factory=list)  # skipped entries/regions (file still loaded)


# ------------------------------------------------------------------------------------------------ problems


class Problems:
    """Problems of one file. `flush()` warns once per file (per `Problems`): the count and the first few."""

    def __init__(self, where: str, warn: Callable[[str], None] | None, note: str = "") -> None:
        self.where, self._warn, self.note = where, warn, note
        self.items: list[str] = []
        self._warned = False

    def add(self, msg: str) -> None:
        self.items.append(msg)

    def flush(self) -> None:
        if self._warned or not self.items or self._warn is None:
            return
        self._warned = True
        n, first = len(self.items), "; ".join(self.items[:MAX_PROBLEMS_WARNED])
        more = f" (+{n - MAX_PROBLEMS_WARNED} more)" if n > MAX_PROBLEMS_WARNED else ""
        self._warn(f"tuning DB {self.where}: {n} problem(s){self.note}: {first}{more}; further problems of this "
                   "file are not warned again in this epoch (`oasr tune status` lists them all)")


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


# ------------------------------------------------------------------------------------------- entry checks


def check_config(cfg: Any, lane: Any, table: Mapping[str, Any], op: str, memo: dict) -> str | None:
    """None if `cfg` may be served from this file for `op`, else why not."""
    if not isinstance(cfg, str):
        return f"config {_short(cfg)} is not a string"
    key = (cfg, op.endswith("_quant"))  # the quantizing ops reject Stream-K: the answer depends on the op
    if key not in memo:
        memo[key] = _check_config_uncached(cfg, lane, table, op)
    return memo[key]


def _check_config_uncached(cfg: str, lane: Any, table: Mapping[str, Any], op: str) -> str | None:
    if cfg in SENTINELS:
        return None
    try:
        c = parse(cfg)
    except ConfigError:
        return f"unknown config id {_short(cfg)}"
    if lane is not None:
        try:
            lane.get(cfg)
        except ConfigError:
            return f"config {cfg} is not in lane {lane.name}'s space"
    if cfg in table:
        try:
            if Config.from_dict(table[cfg]) != c:
                return f"configs table parameters for {cfg} disagree with its id"
        except Exception:  # hostile parameters: ConfigError, but also OverflowError (int(inf)), AttributeError...
            return f"configs table parameters for {cfg} are malformed"
    if op.endswith("_quant") and c.kernel_schedule == "streamk":
        return f"{cfg} is a Stream-K tile; there is no quantizing Stream-K launcher"
    return None


def region_rows_problem(raw: Any) -> str | None:
    """Why `raw` is not a region table's shape — a list of ``[m_hi, config]`` rows, m_hi an integer >= 1 or null,
    config a string — or None. The strict check of the offline tools that read a file as a whole and refuse it
    (`oasr tune evaluate --db`, `serving-regions`); the serving path's `_parse_regions` skips such rows instead."""
    if not isinstance(raw, list):
        return "regions is not a list"
    for i, r in enumerate(raw):
        if not (isinstance(r, list) and len(r) == 2 and isinstance(r[1], str)
                and (r[0] is None or (type(r[0]) is int and r[0] >= 1))):
            return f"region {i} {json.dumps(r)[:80]} is not [m_hi (an integer >= 1, or null), config]"
    return None


def _parse_regions(raw: Any, sig: str, lane: Any, table: Mapping[str, Any], op: str,
                   pr: Problems, memo: dict, field_name: str = "regions"
                   ) -> tuple[tuple[int | None, str | None], ...] | None:
    if not isinstance(raw, list):
        if field_name == "regions":
            pr.add(f"entry {_short(sig)}: regions is not a list; entry skipped")
        else:  # the optional eager table: without it an eager graph is served the regions
            pr.add(f"entry {_short(sig)}: {field_name} is not a list; ignored (regions serve)")
        return None
    row = "region" if field_name == "regions" else f"{field_name} row"
    out: list[tuple[int | None, str | None]] = []
    last = 0
    for i, r in enumerate(raw):
        if out and out[-1][0] is None:
            pr.add(f"entry {sig}: {row} {i} follows the catch-all (unreachable); skipped")
            break
        if not (isinstance(r, list) and len(r) == 2):
            pr.add(f"entry {sig}: {row} {i} is not [m_hi, config]; skipped")
            continue
        m_hi, cfg = r
        if m_hi is not None:
            if type(m_hi) is not int or not (1 <= m_hi <= _MAX_M):
                pr.add(f"entry {sig}: {row} {i} m_hi {_short(m_hi)} is not a positive int; skipped")
                continue
            if m_hi <= last:
                pr.add(f"entry {sig}: {row} {i} m_hi {m_hi} out of order (after {last}); skipped")
                continue
            last = m_hi
        why = check_config(cfg, lane, table, op, memo)
        if why is not None:
            pr.add(f"entry {sig}: {row} {i}: {why}; falls through to the next tier")
            cfg = None
        out.append((m_hi, cfg))
    return tuple(out)


def _parse_points(raw: Any, sig: str, family: str, lane: Any, table: Mapping[str, Any], op: str,
                  pr: Problems, memo: dict) -> dict[str, str]:
    if raw is None:
        return {}
    if not _registry.get(family).exact_points:
        pr.add(f"entry {sig}: exact points are a conv1d form; ignored")
        return {}
    if not isinstance(raw, dict):
        pr.add(f"entry {sig}: points is not an object; ignored")
        return {}
    out: dict[str, str] = {}
    for key, cfg in raw.items():
        if not (isinstance(key, str) and _POINT_RE.fullmatch(key)):
            pr.add(f"entry {sig}: point key {_short(key)} is not 'BxT'; skipped")
            continue
        why = check_config(cfg, lane, table, op, memo)
        if why is not None:
            pr.add(f"entry {sig}: point {key}: {why}; skipped")
            continue
        out[key] = cfg
    return out


def parse_entry(sig: Any, raw: Any, family: str, lane: Any, table: Mapping[str, Any], pr: Problems,
                memo: dict) -> Entry | None:
    """The validated entry, or None (the reason added to `pr`)."""
    parts = parse_signature(sig)
    if parts is None or parts.family != family:
        pr.add(f"entry {_short(sig)}: not a {family} signature; skipped")
        return None
    if not isinstance(raw, dict):
        pr.add(f"entry {sig}: not an object; skipped")
        return None
    if too_deep(raw, MAX_DEPTH - 2):  # the entry sits two levels down (document, entries); readers see only the
        # served fields here, a writer the whole entry (what it passes in must stay dumpable at any stack depth)
        pr.add(f"entry {sig}: nested deeper than {MAX_DEPTH} levels; skipped")
        return None
    regions: tuple = ()
    if "regions" in raw or "points" not in raw:
        parsed = _parse_regions(raw.get("regions"), sig, lane, table, parts.op, pr, memo)
        if parsed is None:
            return None
        regions = parsed
    eager = None
    if "regions_eager" in raw:  # regions for graphs run without CUDA graphs (tune/serving_regions.py)
        eager = _parse_regions(raw["regions_eager"], sig, lane, table, parts.op, pr, memo, "regions_eager")
    points = _parse_points(raw.get("points"), sig, family, lane, table, parts.op, pr, memo)
    soft = raw.get("soft")
    if soft is not None and not isinstance(soft, dict):
        pr.add(f"entry {sig}: soft validators malformed; treated as unknown (stale)")
        soft = {}
    source = raw.get("source") if isinstance(raw.get("source"), str) else None
    return Entry(sig, regions, points, soft, source, eager)


def too_deep(obj: Any, limit: int) -> bool:
    """True when `obj` nests containers more than `limit` levels (a container is level 1). Iterative: the
    answer never depends on the caller's stack depth."""
    level = [obj] if isinstance(obj, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        nxt: list = []
        for o in level:
            nxt.extend(v for v in (o.values() if isinstance(o, dict) else o) if isinstance(v, (dict, list)))
        level = nxt
    return False


def in_fresh_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` in a fresh thread, garbage collection paused. The C JSON parser and encoder recurse once per nesting
    level against the thread's recursion budget; a fresh thread has the whole budget, so whether a file parses (or
    is written) never depends on how deep the caller's stack is. GC is paused because a parse creates millions of
    containers and no cycles: collections walking them cost 5x the parse on a 64 MiB file
    (benchmarks/db_big_file.py). Exceptions are re-raised in the caller's thread."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except BaseException as e:  # handed back to the caller's thread
            box["err"] = e

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            t = threading.Thread(target=run, name="oasr-db-json", daemon=True)
            t.start()
            t.join()
        except RuntimeError:  # no thread can be started here: run in this one
            run()
    finally:
        if was_enabled:
            gc.enable()
    if "err" in box:
        raise box["err"]
    return box["out"]


# ------------------------------------------------------------------------------------------- lazy entries


class Entries(Mapping[str, Entry]):
    """Signature -> validated `Entry`, each parsed from its compact JSON text and validated on first access (`get`
    is the lookup path). Iterating,
    `len` and `validate_all` validate every entry; entries that fail are absent (their problems recorded)."""

    def __init__(self, raw: dict[str, Any], family: str, lane: Any, table: Mapping[str, Any], pr: Problems,
                 rep: FileReport) -> None:
        self._raw, self._family, self._lane, self._table, self._pr, self._rep = raw, family, lane, table, pr, rep
        self._done: dict[str, Entry | None] = {}
        self._memo: dict = {}
        self._lock = threading.Lock()
        self._all = False

    def _validate(self, sig: str, flush: bool = True) -> Entry | None:
        with self._lock:
            if sig in self._done:
                return self._done[sig]
            text = self._raw[sig]  # compact JSON of the served fields (`db_files._slim`)
            if text.count("[") + text.count("{") > MAX_DEPTH:  # could nest deeply: parse where stack depth can't matter
                raw = in_fresh_thread(lambda: json.loads(text))
            else:
                raw = json.loads(text)
            e = parse_entry(sig, raw, self._family, self._lane, self._table, self._pr, self._memo)
            self._done[sig] = e
            if e is not None:
                self._rep.entries += 1
        if flush:  # a lookup's validation warns at once (once per file); `validate_all` warns at its end
            self._pr.flush()
        return e

    def get(self, sig: Any, default: Any = None) -> Any:  # type: ignore[override]
        if not isinstance(sig, str):
            return default
        e = self._done.get(sig, self)  # `self`: not validated yet
        if e is self:
            if sig not in self._raw:
                return default
            e = self._validate(sig)
        return default if e is None else e

    def __getitem__(self, sig: str) -> Entry:
        e = self.get(sig)
        if e is None:
            raise KeyError(sig)
        return e

    def __contains__(self, sig: object) -> bool:
        return self.get(sig) is not None

    def validate_all(self) -> None:
        if self._all:
            return
        for sig in self._raw:
            if sig not in self._done:
                self._validate(sig, flush=False)
        self._all = True
        self._pr.flush()

    def __iter__(self) -> Iterator[str]:
        self.validate_all()
        return iter([s for s in self._raw if self._done[s] is not None])

    def __len__(self) -> int:
        self.validate_all()
        return self._rep.entries

