"""The tuning database: measured kernel choices per (arch family, kernel family), in two tiers.

Layout. One JSON file per (arch family, kernel family): ``<tier>/sm90/gemm.json``, ``scaled_mm.json``,
``conv1d.json`` (``scaled_mm_fp8.json`` too). Tiers, highest precedence first, per signature:

* user   ``paths.user_db_dir()/sm<family>/`` — None (disabled) when ``OASR_TUNE_USER_DB=off``;
* system ``paths.system_db_dir()/sm<family>/`` — shipped, changed by review only.

The environment is read when an epoch's snapshot is first used (after import or `reload()`), never at import.

File format (schema 2)::

    {"schema": 2, "kernel_family": "gemm", "arch_family": "sm90", "lane": "sm90_f16_wgmma",
     "validators": {"impl": "...", "sku": "NVIDIA H200", "nvcc": "V13.0.48", "cutlass": "4.2.0.0"},
     "configs": {"t64x64x64_c1x1_pp": {<Config.to_dict()>}, ...},
     "entries": {"gemm|op=gemm|dt=half|N=512|K=256": {
         "regions": [[512, "t64x64x64_c1x1_pp"], [null, "default"]],
         "evidence": {...}, "source": "aot", "notes": [...], "soft": {...}  # soft only where it differs
     }},
     "model": {...}}   # optional cost-model parameters

Signatures are the spec's strings (`signature()`): ``gemm|op=gemm|dt=half|N=512|K=256`` (ops gemm,
gemm_activation), ``scaled_mm|op=scaled_mm|N=768|K=256`` (ops scaled_mm, scaled_mm_quant; no dtype),
``conv1d|op=conv1d|dt=half|N=<out channels>|K=<in channels x width>`` (the conv's GEMM view),
``bmm|op=bmm|dt=half|N=..|K=..`` (ops bmm, bmm_nn: the B operand's layout; the M axis is L * M).

Regions round UP: M takes the first region with ``m_hi >= M``; ``null`` is the catch-all. An entry without a
catch-all (what autotune writes) does not cover an M above its largest region: the next tier answers.
``dt=half`` serves fp16 and bf16; a ``dt=fp16``/``dt=bf16`` entry comes first for its own dtype (the lookup chain
is user/specific, user/half, system/specific, system/half, each falling through where it does not cover M).
Conv1D entries may carry exact ``"points": {"1x3000": cfg}`` (B x T as the census records it) until they are
re-measured as regions over M = B * T_out; `Entry.lookup_point` tries the point, then the regions.

Validators (see `validators.py`). Hard (schema, kernel_family, arch_family, lane) mismatch → the whole file is
skipped with one warning. Soft mismatch → the file stays in service; `report()` lists the stale entries with the
validators that differ, each entry judged against its OWN validators: the entry's ``soft`` field if it has one,
else the file's ``validators`` stamp.

Writers (`publish`): take ``<file>.lock`` (filelock), re-read the file, apply only this writer's entries, write
atomically (temp file in the same directory, fsync, os.replace, directory fsync), release. The lock is held for the
merge and the write only, never for measuring. ``fresh=True`` replaces the file. A crash at any instant leaves the
old or the new file. Re-stamping: the file gets the writer's soft validators; every entry the writer did not write
keeps the validators it was measured under as its own ``soft`` field (dropped where it equals the new stamp).
Mixed entries (decision): with ``merge_regions=True`` a written entry is merged point-wise into the existing one
(new regions win at equal ``m_hi``); if the existing entry was measured under other validators, the merged entry
keeps the OLDER set as its ``soft`` field, so it stays stale until a non-merging write (a rebuild) replaces it.
We keep one validator set per entry (the oldest still represented), not a history: staleness only needs "is any
part of this entry measured under something else".

Snapshots. A file is read at most once per epoch (lazily, on first use). `reload()` starts a new epoch; nothing
else changes what a lookup returns inside a process. A `publish` does not reload.

Hostile input. A file over `MAX_FILE_BYTES` (checked with stat before reading), unreadable, not UTF-8, not JSON,
too deeply nested or of the wrong shape is skipped; a bad entry (bad signature, wrong types) is skipped; a bad
region (non-integer / non-positive / out-of-order ``m_hi``, unreachable after the catch-all, a config id that does
not parse, is not in the lane's space, disagrees with the file's ``configs`` table, or is a Stream-K tile for a
``*_quant`` op) becomes a hole: M in its interval falls through to the next tier. Each problem is reported by one
`TuningDBWarning` per epoch and recorded for `report()`. Lookups never raise. Only ids that parse into the config
space (or are sentinels) ever leave this module, so a DB string never reaches a compiler unvalidated.

Raises: `signature` raises ValueError on bad parts; `publish` raises ValueError on invalid entries/arguments,
RuntimeError when the user tier is disabled or no arch is known, TimeoutError when the lock cannot be taken, and
OSError from the filesystem. Nothing else here raises on DB content.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .. import paths
from ..configs import SENTINELS, Config, ConfigError, parse
from . import validators as _val
from . import registry as _registry
from .arch import current_arch_family, normalize_arch, require_arch

SCHEMA_VERSION = _val.SCHEMA_VERSION
MAX_FILE_BYTES = 64 * 1024 * 1024
LOCK_TIMEOUT_S = 120.0

# Families whose signature carries the activation dtype (the quantized families' operand dtype is the family).
SIG_DTYPES = ("half", "fp16", "bf16")
TIERS = ("user", "system")

_SIG_RE = re.compile(r"^([a-z0-9_]{1,32})\|op=([a-z0-9_]{1,32})(?:\|dt=([a-z0-9]{1,8}))?\|N=(\d{1,9})\|K=(\d{1,9})$")
_ARCH_DIR_RE = re.compile(r"^sm\d{2,3}$")
_LANE_RE = re.compile(r"^[a-z0-9_]{1,64}$")
_POINT_RE = re.compile(r"^(\d{1,9})x(\d{1,9})$")
_MAX_M = 1 << 62


def _known(family: str, op: str) -> bool:
    """`family` is registered (oasr_ops/families) and `op` is one of its ops."""
    fams = _registry.families()
    return family in fams and op in fams[family].ops


class TuningDBWarning(UserWarning):
    """A tuning file, entry or region was skipped (or an entry is unusable here)."""


# ---------------------------------------------------------------------------------------------- signatures


def normalize_dtype(dtype: Any) -> str:
    """torch dtypes and spellings -> 'fp16' | 'bf16' | 'half' | 'int8' | 'fp8' | 'fp32'. ValueError otherwise."""
    s = str(dtype).lower().removeprefix("torch.")
    table = {"float16": "fp16", "fp16": "fp16", "half": "half", "bfloat16": "bf16", "bf16": "bf16",
             "int8": "int8", "float8_e4m3fn": "fp8", "fp8": "fp8", "float32": "fp32", "fp32": "fp32"}
    try:
        return table[s]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None


def signature(family: str, op: str, dtype: Any, n: int, k: int) -> str:
    """The spec's signature string. `dtype` is ignored for the quantized families. ValueError on bad parts."""
    if not _known(family, op):
        raise ValueError(f"unknown family/op {family!r}/{op!r}")
    if not (isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0):
        raise ValueError(f"N and K must be positive ints, got {n!r}, {k!r}")
    if _registry.get(family).dtyped:
        dt = normalize_dtype(dtype)
        if dt not in SIG_DTYPES:
            raise ValueError(f"{family} signatures take dt half/fp16/bf16, not {dt}")
        return f"{family}|op={op}|dt={dt}|N={n}|K={k}"
    return f"{family}|op={op}|N={n}|K={k}"


@dataclass(frozen=True)
class SigParts:
    family: str
    op: str
    dt: str | None
    n: int
    k: int


def parse_signature(sig: Any) -> SigParts | None:
    """The parts of a well-formed signature, or None."""
    if not isinstance(sig, str):
        return None
    m = _SIG_RE.match(sig)
    if not m:
        return None
    fam, op, dt, n, k = m.groups()
    if not _known(fam, op):
        return None
    if _registry.get(fam).dtyped != (dt is not None) or (dt is not None and dt not in SIG_DTYPES):
        return None
    if int(n) <= 0 or int(k) <= 0 or signature(fam, op, dt or "half", int(n), int(k)) != sig:
        return None  # also rejects leading zeros: one spelling per signature
    return SigParts(fam, op, dt, int(n), int(k))


def lookup_signatures(family: str, op: str, dtype: Any, n: int, k: int) -> list[str]:
    """Signatures to try within one tier, most specific first (dt=fp16/bf16 before dt=half)."""
    if not _registry.get(family).dtyped:
        return [signature(family, op, None, n, k)]
    dt = normalize_dtype(dtype)
    if dt in ("fp16", "bf16"):
        return [signature(family, op, dt, n, k), signature(family, op, "half", n, k)]
    if dt == "half":
        return [signature(family, op, "half", n, k)]
    return []  # fp32/int8 calls of a half-precision family: nothing in the DB serves them


# ------------------------------------------------------------------------------------------------ entries


@dataclass(frozen=True)
class Entry:
    """One validated entry. A region config of None is a hole (a skipped region): its M falls through."""

    signature: str
    regions: tuple[tuple[int | None, str | None], ...]
    points: Mapping[str, str] = field(default_factory=dict)
    soft: dict[str, Any] | None = None  # the entry's own validators, when it carries them
    source: str | None = None

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
    """What loading one file did, for `report()` / `oasr tune status`."""

    path: str
    tier: str
    arch: str
    family: str
    status: str  # "loaded" | "skipped"
    reason: str | None = None
    lane: str | None = None
    entries: int = 0
    problems: list[str] = field(default_factory=list)  # skipped entries/regions (file still loaded)


@dataclass
class LoadedFile:
    path: Path
    tier: str
    arch: str
    family: str
    lane: str | None
    validators: dict[str, Any]
    entries: dict[str, Entry]
    model: dict[str, Any] | None
    digest: str  # sha256 of the validated content that decides selections

    def own_validators(self, e: Entry) -> dict[str, Any]:
        return e.soft if e.soft is not None else self.validators


# ------------------------------------------------------------------------------------------------ parsing


class _Problems:
    """Collects problems for one file; warns once per distinct message per epoch (or raises, for writers)."""

    def __init__(self, where: str, warn: Callable[[str], None] | None) -> None:
        self.where, self._warn, self.items = where, warn, []  # type: ignore[var-annotated]

    def add(self, msg: str) -> None:
        self.items.append(msg)
        if self._warn is not None:
            self._warn(f"tuning DB {self.where}: {msg}")


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


def _lane_obj(name: str | None):
    if not name:
        return None
    return _registry.lanes().get(name)


def expected_lane(arch: str, family: str) -> str | None:
    """The lane a file for (arch, family) must name: the native lane, or None where no lane is registered."""
    lane = _registry.native_lane(arch, family)
    return lane.name if lane is not None else None


def _check_config(cfg: Any, lane: Any, table: Mapping[str, Any], op: str, memo: dict) -> str | None:
    """None if `cfg` may be served from this file for `op`, else why not."""
    if not isinstance(cfg, str):
        return _check_config_uncached(cfg, lane, table, op)
    key = (cfg, op.endswith("_quant"))  # the quantizing ops reject Stream-K: the answer depends on the op
    if key not in memo:
        memo[key] = _check_config_uncached(cfg, lane, table, op)
    return memo[key]


def _check_config_uncached(cfg: Any, lane: Any, table: Mapping[str, Any], op: str) -> str | None:
    if not isinstance(cfg, str):
        return f"config {_short(cfg)} is not a string"
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


def _parse_regions(raw: Any, sig: str, lane: Any, table: Mapping[str, Any], op: str,
                   pr: _Problems, memo: dict) -> tuple[tuple[int | None, str | None], ...] | None:
    if not isinstance(raw, list):
        pr.add(f"entry {_short(sig)}: regions is not a list; entry skipped")
        return None
    out: list[tuple[int | None, str | None]] = []
    last = 0
    for i, r in enumerate(raw):
        if out and out[-1][0] is None:
            pr.add(f"entry {sig}: region {i} follows the catch-all (unreachable); skipped")
            break
        if not (isinstance(r, list) and len(r) == 2):
            pr.add(f"entry {sig}: region {i} is not [m_hi, config]; skipped")
            continue
        m_hi, cfg = r
        if m_hi is not None:
            if type(m_hi) is not int or not (1 <= m_hi <= _MAX_M):
                pr.add(f"entry {sig}: region {i} m_hi {_short(m_hi)} is not a positive int; skipped")
                continue
            if m_hi <= last:
                pr.add(f"entry {sig}: region {i} m_hi {m_hi} out of order (after {last}); skipped")
                continue
            last = m_hi
        why = _check_config(cfg, lane, table, op, memo)
        if why is not None:
            pr.add(f"entry {sig}: region {i}: {why}; falls through to the next tier")
            cfg = None
        out.append((m_hi, cfg))
    return tuple(out)


def _parse_points(raw: Any, sig: str, family: str, lane: Any, table: Mapping[str, Any], op: str,
                  pr: _Problems, memo: dict) -> dict[str, str]:
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
        if not (isinstance(key, str) and _POINT_RE.match(key)):
            pr.add(f"entry {sig}: point key {_short(key)} is not 'BxT'; skipped")
            continue
        why = _check_config(cfg, lane, table, op, memo)
        if why is not None:
            pr.add(f"entry {sig}: point {key}: {why}; skipped")
            continue
        b, t = (int(x) for x in key.split("x"))
        out[f"{b}x{t}"] = cfg
    return out


def _parse_entry(sig: Any, raw: Any, family: str, lane: Any, table: Mapping[str, Any], pr: _Problems,
                 memo: dict) -> Entry | None:
    parts = parse_signature(sig)
    if parts is None or parts.family != family:
        pr.add(f"entry {_short(sig)}: not a {family} signature; skipped")
        return None
    if not isinstance(raw, dict):
        pr.add(f"entry {sig}: not an object; skipped")
        return None
    regions: tuple = ()
    if "regions" in raw or "points" not in raw:
        parsed = _parse_regions(raw.get("regions"), sig, lane, table, parts.op, pr, memo)
        if parsed is None:
            return None
        regions = parsed
    points = _parse_points(raw.get("points"), sig, family, lane, table, parts.op, pr, memo)
    soft = raw.get("soft")
    if soft is not None and not isinstance(soft, dict):
        pr.add(f"entry {sig}: soft validators malformed; treated as unknown (stale)")
        soft = {}
    source = raw.get("source") if isinstance(raw.get("source"), str) else None
    return Entry(sig, regions, points, soft, source)


def _canonical_digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _read_json(path: Path) -> tuple[Any, str | None]:
    """(document, None) or (None, why). Checks the size before reading a byte."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None, "absent"
    except OSError as e:
        return None, f"cannot stat: {e.strerror or e}"
    import stat as _stat

    if not _stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    if st.st_size > MAX_FILE_BYTES:
        return None, f"{st.st_size} bytes, over the {MAX_FILE_BYTES}-byte cap"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # the file may have grown since stat
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    if len(data) > MAX_FILE_BYTES:
        return None, f"over the {MAX_FILE_BYTES}-byte cap"
    try:
        return json.loads(data.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as e:
        return None, f"not valid JSON ({str(e)[:80]})"


def _hard_mismatch(doc: Mapping[str, Any], family: str, arch: str, lane_expected: str | None) -> str | None:
    schema = doc.get("schema")
    if type(schema) is not int or schema != SCHEMA_VERSION:
        return f"schema {_short(schema)} != {SCHEMA_VERSION}"
    if doc.get("kernel_family") != family:
        return f"kernel_family {_short(doc.get('kernel_family'))} != {family!r}"
    if doc.get("arch_family") != arch:
        return f"arch_family {_short(doc.get('arch_family'))} != {arch!r}"
    lane = doc.get("lane")
    if lane is not None and not (isinstance(lane, str) and _LANE_RE.match(lane)):
        return f"lane {_short(lane)} malformed"
    if lane_expected is not None:
        if lane != lane_expected:
            return f"lane {_short(lane)} != {lane_expected!r}"
    else:
        lobj = _lane_obj(lane)
        if lobj is not None and lobj.family != family:
            return f"lane {lane!r} serves family {lobj.family!r}, not {family!r}"
    return None


def load_file(path: Path, tier: str, arch: str, family: str, lane_expected: str | None,
              warn: Callable[[str], None] | None) -> tuple[LoadedFile | None, FileReport | None]:
    """Validate one file. (None, None) when absent; (None, report) when skipped. Never raises."""
    doc, why = _read_json(path)
    if why == "absent":
        return None, None
    rep = FileReport(str(path), tier, arch, family, "skipped")
    pr = _Problems(str(path), warn)

    def skip(reason: str) -> tuple[None, FileReport]:
        rep.reason = reason
        if warn is not None:
            warn(f"tuning DB {path}: skipped: {reason}")
        return None, rep

    if why is not None:
        return skip(why)
    if not isinstance(doc, dict):
        return skip("top level is not an object")
    bad = _hard_mismatch(doc, family, arch, lane_expected)
    if bad is not None:
        return skip(f"hard validator mismatch: {bad}")
    lane_name = doc.get("lane")
    lane = _lane_obj(lane_name)
    rep.lane = lane_name
    stamp = doc.get("validators")
    if stamp is None:
        stamp = {}
    elif not isinstance(stamp, dict):
        pr.add("validators stamp malformed; entries treated as unstamped (stale)")
        stamp = {}
    table = doc.get("configs", {})
    if not isinstance(table, dict):
        pr.add("configs table is not an object; ignored")
        table = {}
    raw_entries = doc.get("entries", {})
    if not isinstance(raw_entries, dict):
        return skip("entries is not an object")
    model = doc.get("model")
    if model is not None and not isinstance(model, dict):
        pr.add("model is not an object; ignored")
        model = None
    memo: dict = {}
    entries: dict[str, Entry] = {}
    for sig, raw in raw_entries.items():
        e = _parse_entry(sig, raw, family, lane, table, pr, memo)
        if e is not None:
            entries[e.signature] = e
    digest = _canonical_digest({
        "tier": tier, "arch": arch, "family": family, "lane": lane_name, "model": model,
        "entries": {s: [list(map(list, e.regions)), sorted(e.points.items())] for s, e in sorted(entries.items())},
    })
    rep.status, rep.entries, rep.problems = "loaded", len(entries), pr.items
    return LoadedFile(path, tier, arch, family, lane_name, dict(stamp), entries, model, digest), rep


# ---------------------------------------------------------------------------------------------- snapshots


class _Snapshot:
    """Everything read in one epoch. Tier directories are resolved from the environment when created."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.user_dir: Path | None = paths.user_db_dir()
        self.system_dir: Path = paths.system_db_dir()
        self._files: dict[tuple[str, str, str, str | None], LoadedFile | None] = {}
        self.reports: dict[str, FileReport] = {}
        self._warned: set[str] = set()
        self._lock = threading.RLock()

    def tier_dir(self, tier: str) -> Path | None:
        return self.user_dir if tier == "user" else self.system_dir

    def warn(self, msg: str) -> None:
        with self._lock:
            if msg in self._warned:
                return
            self._warned.add(msg)
        warnings.warn(msg, TuningDBWarning, stacklevel=3)

    def file(self, tier: str, arch: str, family: str, lane: str | None = None) -> LoadedFile | None:
        lane_expected = lane if lane is not None else expected_lane(arch, family)
        key = (tier, arch, family, lane_expected)
        try:
            return self._files[key]
        except KeyError:
            pass
        with self._lock:
            if key in self._files:
                return self._files[key]
            root = self.tier_dir(tier)
            lf = None
            if root is not None:
                path = root / arch / f"{family}.json"
                try:
                    lf, rep = load_file(path, tier, arch, family, lane_expected, self.warn)
                except Exception as e:  # belt and braces: a lookup never raises on DB content
                    lf, rep = None, FileReport(str(path), tier, arch, family, "skipped", f"internal error: {e!r}")
                    self.warn(f"tuning DB {path}: skipped: internal error {e!r}")
                if rep is not None:
                    self.reports[str(path)] = rep
            self._files[key] = lf
            return lf

    def arch_dirs(self) -> list[str]:
        found: set[str] = set()
        for tier in TIERS:
            root = self.tier_dir(tier)
            try:
                if root is not None and root.is_dir():
                    found.update(p.name for p in root.iterdir() if p.is_dir() and _ARCH_DIR_RE.match(p.name))
            except OSError:
                pass
        return sorted(found)


class _State:
    def __init__(self) -> None:
        self.epoch = 0
        self.snapshot: _Snapshot | None = None
        self.lock = threading.Lock()
        self.listeners: list[Callable[[int], None]] = []


_STATE = _State()


def _snap() -> _Snapshot:
    s = _STATE.snapshot
    if s is not None:
        return s
    with _STATE.lock:
        if _STATE.snapshot is None:
            _STATE.snapshot = _Snapshot(_STATE.epoch)
        return _STATE.snapshot


def epoch() -> int:
    return _STATE.epoch


def reload() -> int:
    """Start a new epoch: files are re-read (and the environment re-read) on next use. Returns the new epoch."""
    with _STATE.lock:
        _STATE.epoch += 1
        _STATE.snapshot = None
        _val.clear_cache()
        listeners = list(_STATE.listeners)
    for fn in listeners:
        fn(_STATE.epoch)
    return _STATE.epoch


def on_reload(fn: Callable[[int], None]) -> None:
    """Call `fn(new_epoch)` after every `reload()` (select uses it to drop its memo)."""
    _STATE.listeners.append(fn)


def tier_dirs() -> dict[str, Path | None]:
    s = _snap()
    return {"user": s.user_dir, "system": s.system_dir}


def get_file(tier: str, arch: str, family: str, lane: str | None = None) -> LoadedFile | None:
    """The validated file of a tier for (arch, family) in this epoch, or None (absent, disabled, skipped)."""
    return _snap().file(tier, normalize_arch(arch), family, lane)


def chain(family: str, op: str, dtype: Any, n: int, k: int, arch: str,
          lane: str | None = None) -> list[tuple[str, Entry]]:
    """The entries a lookup walks, in precedence order: [(tier, entry), ...]. Never raises on DB content."""
    try:
        sigs = lookup_signatures(family, op, dtype, n, k)
    except ValueError:
        return []
    s = _snap()
    out: list[tuple[str, Entry]] = []
    for tier in TIERS:
        lf = s.file(tier, arch, family, lane)
        if lf is None:
            continue
        for sig in sigs:
            e = lf.entries.get(sig)
            if e is not None:
                out.append((tier, e))
    return out


def lookup(family: str, op: str, dtype: Any, n: int, k: int, m: int, arch: str | None = None,
           lane: str | None = None) -> tuple[str, str] | None:
    """(config, tier) from the DB tiers alone, or None when no tier covers M. Never raises on DB content."""
    a = normalize_arch(arch) if arch else current_arch_family()
    if a is None:
        return None
    for tier, e in chain(family, op, dtype, n, k, a, lane):
        cfg = e.lookup(m)
        if cfg is not None:
            return cfg, tier
    return None


def referenced_configs(family: str, arch: str, lane: str | None = None) -> list[str]:
    """Every concrete config id the tiers' entries name for (family, arch): the DB's part of the production
    compile set. Sentinels and holes are left out. Never raises on DB content."""
    out: list[str] = []
    for tier in TIERS:
        lf = get_file(tier, arch, family, lane)
        if lf is None:
            continue
        for e in lf.entries.values():
            for cfg in [c for _, c in e.regions] + list(e.points.values()):
                if cfg and cfg not in SENTINELS and cfg not in out:
                    out.append(cfg)
    return out


def model_params(family: str, arch: str, lane: str | None = None) -> dict[str, Any] | None:
    """The cost-model parameters the arch's file ships (user tier first), or None."""
    for tier in TIERS:
        lf = get_file(tier, arch, family, lane)
        if lf is not None and lf.model is not None:
            return lf.model
    return None


def snapshot_hash(arch: str | None = None) -> str:
    """A stable hash of the validated content of every tier (for a torch.compile pass uuid).

    Covers one arch when given (or when a current arch is known), else every sm* directory found. Paths are
    not hashed, so two machines with the same DB content agree.
    """
    s = _snap()
    a = normalize_arch(arch) if arch else current_arch_family()
    archs = [a] if a else s.arch_dirs()
    h = hashlib.sha256(f"schema={SCHEMA_VERSION}".encode())
    for ar in archs:
        for fam in _registry.families():
            for tier in TIERS:
                lf = s.file(tier, ar, fam)
                h.update(f"|{tier}/{ar}/{fam}=".encode())
                h.update((lf.digest if lf is not None else "-").encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------- report


@dataclass
class StaleEntry:
    path: str
    tier: str
    signature: str
    validators: list[str]  # the soft validators that differ


def report(arch: str | None = None) -> dict[str, Any]:
    """Tiers, files loaded/skipped (with why), per-entry problems and stale entries. Never raises."""
    s = _snap()
    a = normalize_arch(arch) if arch else current_arch_family()
    archs = [a] if a else s.arch_dirs()
    stale: list[StaleEntry] = []
    for ar in archs:
        for fam in _registry.families():
            for tier in TIERS:
                lf = s.file(tier, ar, fam)
                if lf is None:
                    continue
                cur = _val.current_soft_validators(lf.lane)
                for sig, e in sorted(lf.entries.items()):
                    diff = _val.soft_mismatches(lf.own_validators(e), cur)
                    if diff:
                        stale.append(StaleEntry(str(lf.path), tier, sig, diff))
    return {
        "epoch": s.epoch,
        "archs": archs,
        "tiers": {t: (str(d) if d is not None else None) for t, d in (("user", s.user_dir), ("system", s.system_dir))},
        "tiers_found": {t: bool(d is not None and d.is_dir()) for t, d in (("user", s.user_dir),
                                                                          ("system", s.system_dir))},
        "files": [vars(r) for r in s.reports.values()],
        "stale": [vars(x) for x in stale],
    }
