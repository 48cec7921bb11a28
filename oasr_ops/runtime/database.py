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
         "regions_eager": [[256, "t64x32x64_c1x1_pp"], ...],  # optional: graphs run without CUDA graphs
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

Writers (`publish`, in `oasr_ops.tune.database`): take ``<file>.lock`` (filelock), re-read the file, apply only
this writer's entries, write atomically (temp file in the same directory, fsync, os.replace, directory fsync),
release. An existing file the writer cannot use is moved aside, never overwritten (see `publish`). The lock is held for the
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

Hostile input (reading: `db_files`). A file over `MAX_FILE_BYTES` (checked with stat before reading),
unreadable, not UTF-8, not JSON (truncated, trailing garbage), nested too deeply (the same answer at any caller
stack depth: the parse runs in a fresh thread, depths are then checked iteratively) or of the wrong shape is skipped (the header and each entry's served fields are held to `MAX_DEPTH`; a reader keeps only an
entry's served fields: regions, points, soft, source). A file's first `MAX_ENTRIES` entries are served, the rest skipped. Entries are validated
lazily, per signature, when first looked up (files of at most `EAGER_ENTRIES` entries at load): a bad entry (bad
signature, wrong types, nested too deeply) is skipped; a bad region (non-integer / non-positive / out-of-order
``m_hi``, unreachable after the catch-all, a config id that does not parse, is not in the lane's space, disagrees
with the file's ``configs`` table, or is a Stream-K tile for a ``*_quant`` op) becomes a hole: M in its interval
falls through to the next tier. Problems are aggregated: at most one `TuningDBWarning` per file per epoch, with the
count and the first few reasons; `report()` validates every entry and lists every problem. Lookups never raise.
Only ids that parse into the config space (or are sentinels) ever leave this module, so a DB string never
reaches a compiler unvalidated.

Raises: `signature` raises ValueError on bad parts; `publish` raises ValueError on invalid entries/arguments,
RuntimeError when the user tier is disabled, no arch is known or an unusable file cannot be moved aside,
TimeoutError when the lock cannot be taken, and
OSError from the filesystem. Nothing else here raises on DB content.
"""
from __future__ import annotations

import hashlib
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import paths
from . import registry as _registry
from . import validators as _val
from .arch import current_arch_family, normalize_arch
# The file layer and the signatures, re-exported: `oasr_ops.runtime.database` is the reader's one public module.
from .db_files import (EAGER_ENTRIES, MAX_DEPTH, MAX_ENTRIES, MAX_FILE_BYTES, SCHEMA_VERSION, Entries,  # noqa: F401
                       Entry, FileReport, LoadedFile, TuningDBWarning, expected_lane, load_file, read_document,
                       read_json)
from .db_files import Problems as _Problems  # noqa: F401  (old private names, used by the writer and tools)
from .db_files import _LANE_RE, hard_mismatch as _hard_mismatch, lane_obj as _lane_obj  # noqa: F401
from .db_files import parse_entry as _parse_entry, read_json as _read_json  # noqa: F401
from .db_signatures import (SIG_DTYPES, SigParts, _known, lookup_signatures, normalize_dtype,  # noqa: F401
                            parse_signature, signature)

LOCK_TIMEOUT_S = 120.0
TIERS = ("user", "system")
_ARCH_DIR_RE = re.compile(r"^sm\d{2,3}$")


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
    """Every concrete config id the tiers' entries name for (family, arch) that passes the config checks: the DB's
    part of the production compile set. Sentinels and invalid ids are left out. Never raises on DB content."""
    out: list[str] = []
    for tier in TIERS:
        lf = get_file(tier, arch, family, lane)
        if lf is None:
            continue
        for cfg in lf.referenced_ids():  # from the raw entries: the compile set must not validate them all
            if cfg not in out:
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
    """Tiers, files loaded/skipped (with why), per-entry problems and stale entries. Validates every entry of
    every file it covers (lookups validate only what they touch). Never raises."""
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
