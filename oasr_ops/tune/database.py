"""The tuning DB's writer: `publish` (locked, atomic) and `db_path`; the reader is `oasr_ops.runtime.database`.

This module is the offline side of the database (build, prewarm, autotune and re-stamping write through it). It
re-exports the reader's public names (`reload`, `epoch`, `signature`, ...) so ``oasr_ops.tune.database`` keeps
working as one import for tools. File format, locking and crash rules: see the reader's module docstring.

Never destroying data (decision). An existing file `publish` cannot use (unreadable, not a regular file, over the
size cap, not UTF-8 or JSON: truncated, trailing garbage; nested too deeply, wrong hard validators: another lane,
a newer schema) is renamed to ``<file>.corrupt-<UTC timestamp>`` under the lock (one atomic rename) and a
`TuningDBWarning` names both paths; when it cannot be moved, `publish` raises and writes nothing. Entries of a
usable file that no reader can serve (a malformed signature, not an object) are dropped from the new file, but
the old file is first kept, hard-linked (or copied), at such a ``.corrupt-`` path, and the warning says so.

Permissions. The new file takes the permission bits of the file it replaces; a new file (or one replacing a file
moved aside) gets 0644 minus the process umask (the temp file is created with mode 0644, so the kernel applies
the umask). Files are never written over `MAX_FILE_BYTES` or `MAX_ENTRIES`: `publish` raises ValueError instead.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import paths
from ..configs import SENTINELS, Config, ConfigError, parse
from ..runtime import registry as _registry
from ..runtime import validators as _val
from ..runtime.arch import normalize_arch, require_arch
from ..runtime.database import *  # noqa: F401,F403  (the reader's public names, for tools and old imports)
from ..runtime.database import LOCK_TIMEOUT_S, SCHEMA_VERSION, TuningDBWarning, expected_lane
from ..runtime.db_files import (_LANE_RE, MAX_ENTRIES, MAX_FILE_BYTES, header_problem, in_fresh_thread, lane_obj,
                                read_document)
from ..runtime.db_entries import Problems, parse_entry
from ..runtime.database import _read_json  # noqa: F401  (old private name; `oasr tune diff` reads through it)
from ..runtime.database import epoch, on_reload, reload  # noqa: F401  (public: oasr_ops.tune.database.reload)
from .serving_regions import with_eager_regions


# ------------------------------------------------------------------------------------------------- writer


def _tier_root(tier: str | os.PathLike) -> Path:
    if tier == "user":
        d = paths.user_db_dir()
        if d is None:
            raise RuntimeError("the user tier is disabled (OASR_TUNE_USER_DB=off)")
        return d
    if tier == "system":
        return paths.system_db_dir()
    if isinstance(tier, (str, os.PathLike)) and str(tier):
        return Path(tier).expanduser()
    raise ValueError(f"tier must be 'user', 'system' or a directory, not {tier!r}")


def db_path(family: str, arch: str, tier: str | os.PathLike = "user") -> Path:
    if family not in _registry.families():
        raise ValueError(f"unknown kernel family {family!r}")
    return _tier_root(tier) / normalize_arch(arch) / f"{family}.json"


def _validate_new_entries(family: str, entries: Mapping[str, Any], lane: Any,
                          configs: Mapping[str, Any]) -> None:
    pr = Problems("publish", None)
    for sig, raw in entries.items():
        parse_entry(sig, raw, family, lane, configs, pr, {})  # also refuses non-canonical ids, over-deep entries
    if pr.items:
        raise ValueError("invalid entries: " + "; ".join(pr.items[:5]))


def _region_key(r: Any) -> tuple[int, int] | None:
    if isinstance(r, list) and len(r) == 2:
        if r[0] is None:
            return (1, 0)
        if type(r[0]) is int:
            return (0, r[0])
    return None


def _merge_regions(old: Any, new: list) -> list:
    """Point-wise union; the new region wins at an equal m_hi; the catch-all stays last."""
    by_key: dict[tuple[int, int], list] = {}
    for r in (old if isinstance(old, list) else []):
        k = _region_key(r)
        if k is not None:
            by_key[k] = list(r)
    for r in new:
        by_key[_region_key(r)] = list(r)  # type: ignore[index]
    return [by_key[k] for k in sorted(by_key)]


def _referenced_ids(entries: Mapping[str, Any]) -> set[str]:
    ids: set[str] = set()
    for e in entries.values():
        if not isinstance(e, dict):
            continue
        for r in [*(e.get("regions") or []), *(e.get("regions_eager") or [])]:
            if isinstance(r, list) and len(r) == 2 and isinstance(r[1], str):
                ids.add(r[1])
        pts = e.get("points")
        if isinstance(pts, dict):
            ids.update(v for v in pts.values() if isinstance(v, str))
    return {i for i in ids if i not in SENTINELS}


def _configs_table(ids: Iterable[str], given: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cid in sorted(ids):
        try:
            c = parse(cid)
        except ConfigError:
            continue  # another writer's bad id: the reader skips that region; we never invent parameters
        params = given.get(cid) or old.get(cid)
        try:
            ok = params is not None and Config.from_dict(params) == c
        except Exception:  # malformed parameters from another writer: regenerate them from the id
            ok = False
        out[cid] = params if ok else c.to_dict()
    return out


def _unservable(sig: Any, e: Any) -> bool:
    """An existing entry no reader can serve: dropped (after the old file is kept aside)."""
    return parse_signature(sig) is None


def _merge(existing: dict[str, Any] | None, new_entries: Mapping[str, Any], *, family: str, arch: str,
           lane: str | None, stamp: dict[str, Any], configs: Mapping[str, Any], merge_regions: bool,
           model: dict[str, Any] | None) -> dict[str, Any]:
    old_entries = existing.get("entries", {}) if existing else {}
    old_stamp = existing.get("validators") if existing else None
    old_stamp = old_stamp if isinstance(old_stamp, dict) else {}
    old_table = existing.get("configs") if existing else None
    old_table = old_table if isinstance(old_table, dict) else {}

    def own(e: dict[str, Any]) -> dict[str, Any]:
        return e["soft"] if isinstance(e.get("soft"), dict) else old_stamp

    entries: dict[str, Any] = {}
    for sig, e in old_entries.items():
        if sig in new_entries or not isinstance(e, dict) or _unservable(sig, e):
            continue
        e = dict(e)
        # Re-stamping: an entry we did not write keeps the validators it was measured under.
        if own(e) != stamp:
            e["soft"] = own(e)
        else:
            e.pop("soft", None)
        entries[sig] = e
    for sig, e in new_entries.items():
        e = json.loads(json.dumps(e))  # a private deep copy of the caller's dict
        old = old_entries.get(sig) if merge_regions else None
        if isinstance(old, dict):
            e["regions"] = _merge_regions(old.get("regions"), e.get("regions") or [])
            if isinstance(old.get("points"), dict) or isinstance(e.get("points"), dict):
                e["points"] = {**(old.get("points") or {}), **(e.get("points") or {})}
            if isinstance(old.get("evidence"), dict):
                e["evidence"] = {**old["evidence"], **(e.get("evidence") or {})}
            if isinstance(old.get("notes"), list):
                e["notes"] = old["notes"] + list(e.get("notes") or [])
            # the eager table is derived from the regions and evidence: re-derived from the merged ones (the old
            # entry's would describe regions that no longer exist; a new entry without one, e.g. measured with
            # host time charged, has none)
            if "regions_eager" in e:
                e = with_eager_regions(e)
            # Mixed entry: it keeps the older validators, so it stays stale until rebuilt.
            if own(old) != stamp:
                e["soft"] = own(old)
            else:
                e.pop("soft", None)
        elif e.get("soft") == stamp:
            e.pop("soft", None)
        entries[sig] = e
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "kernel_family": family, "arch_family": arch, "lane": lane,
        "validators": stamp,
        "configs": _configs_table(_referenced_ids(entries), configs, old_table),
        "entries": dict(sorted(entries.items())),
    }
    old_model = existing.get("model") if existing else None
    if model is not None or isinstance(old_model, dict):
        doc["model"] = model if model is not None else old_model
    return doc


def _format_doc(doc: dict[str, Any]) -> str:
    """JSON with one config / one entry per line: reviewable diffs, and the C encoder's speed."""
    lines = ["{"]
    items = list(doc.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key in ("configs", "entries") and isinstance(value, dict) and value:
            lines.append(f" {json.dumps(key)}: {{")
            sub = list(value.items())
            for j, (k, v) in enumerate(sub):
                lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{',' if j < len(sub) - 1 else ''}")
            lines.append(f" }}{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines)


def _remove_orphans(path: Path) -> None:
    # Temp files are only created under the lock we hold, so any left are a killed writer's: remove them.
    for p in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            p.unlink()
        except OSError:
            pass


class FileChangedError(RuntimeError):
    """`publish(based_on=...)`: the file is not the one the entries were derived from."""


def _move_aside(path: Path, why: str) -> Path:
    """Rename an unusable file out of the way (under the lock). Raises RuntimeError when it cannot be moved."""
    return paths.move_aside(path, why, "tuning DB", TuningDBWarning)


def _keep_copy(path: Path, dropped: list[str]) -> None:
    """Keep the old file (hard link, else a copy) before entries no reader can serve are dropped from it."""
    dest = paths.aside_path(path)
    try:
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)
    except OSError as e:
        raise RuntimeError(f"tuning DB {path}: {len(dropped)} unusable entries would be dropped, but the file could "
                           f"not be kept at {dest} ({e.strerror or e}); refusing to write") from None
    warnings.warn(f"tuning DB {path}: {len(dropped)} entries no reader can serve (malformed signature or not an object, e.g. "
                  f"{dropped[0][:80]!r}) are dropped; the old file is kept at {dest}",
                  TuningDBWarning, stacklevel=3)


def publish(family: str, entries: Mapping[str, Mapping[str, Any]], *, tier: str | os.PathLike = "user",
            arch: str | None = None, fresh: bool = False, lane: str | None = None,
            configs: Mapping[str, Any] | None = None, merge_regions: bool = False,
            model: dict[str, Any] | None = None, lock_timeout: float = LOCK_TIMEOUT_S,
            stamp: Mapping[str, Any] | None = None, based_on: str | None = None) -> Path:
    """Write `entries` (signature -> entry in the file's format) into a tier's file; returns its path.

    Under the file's lock: re-read, keep every entry this writer does not write, replace (or, with
    `merge_regions`, merge point-wise into) the ones it does, re-stamp, write atomically. `fresh` replaces the
    whole file. An existing file that cannot be used is moved aside first (module docstring), never overwritten.
    Does not reload: call `reload()` to serve the new content in this process.
    `stamp`: the soft validators the entries were measured under, when that was not this process (an offline
    re-partition of a GPU build's log); default: this process's.
    `based_on`: the sha256 of the file the caller derived `entries` from ("absent": derived without one), for a
    read-modify-write outside the lock: if the file changed meanwhile, nothing is written and `FileChangedError`
    says so (re-read and derive again: `serving_regions_cli.derive_file` does).
    """
    from filelock import FileLock, Timeout

    if family not in _registry.families():
        raise ValueError(f"unknown kernel family {family!r}")
    a = require_arch(arch)
    lane_name = lane if lane is not None else expected_lane(a, family)
    if lane_name is not None and not _LANE_RE.match(lane_name):
        raise ValueError(f"bad lane name {lane_name!r}")
    lobj = lane_obj(lane_name)
    if lobj is not None and lobj.family != family:
        raise ValueError(f"lane {lane_name} serves {lobj.family}, not {family}")
    configs = dict(configs or {})
    for cid, params in configs.items():
        try:
            same = Config.from_dict(params) == parse(cid)
        except Exception as e:
            raise ValueError(f"configs[{cid!r}] malformed: {e}") from None
        if not same:
            raise ValueError(f"configs[{cid!r}] parameters disagree with the id")
    _validate_new_entries(family, entries, lobj, configs)
    stamp = dict(stamp) if stamp is not None else _val.current_soft_validators(lane_name)
    path = db_path(family, a, tier)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock", timeout=lock_timeout)
    try:
        lock.acquire()
    except Timeout:
        raise TimeoutError(f"could not lock {path} within {lock_timeout}s") from None
    try:
        existing: dict[str, Any] | None = None
        mode: int | None = None
        d = read_document(path)
        if based_on is not None and based_on != ("absent" if d.why == "absent" else d.sha256):
            raise FileChangedError(f"{path} changed since it was read (another writer); nothing written")
        if d.why != "absent":
            why = d.why or header_problem(d.doc, family, a, lane_name)
            if why is not None:
                _move_aside(path, why)  # never overwrite what we could not read
            else:
                mode = d.mode
                if not fresh:
                    existing = d.doc
                    dropped = [str(k) for k, e in existing.get("entries", {}).items()
                               if not isinstance(e, dict) or _unservable(k, e)]
                    if dropped:
                        _keep_copy(path, dropped)
        doc = _merge(existing, entries, family=family, arch=a, lane=lane_name, stamp=stamp, configs=configs,
                     merge_regions=merge_regions, model=model)
        if len(doc["entries"]) > MAX_ENTRIES:
            raise ValueError(f"{path} would hold {len(doc['entries'])} entries, over the {MAX_ENTRIES}-entry cap "
                             "readers serve; nothing written")
        text = in_fresh_thread(lambda: _format_doc(doc))  # the file's deep entries dump at any stack depth
        if len(text.encode("utf-8")) + 1 > MAX_FILE_BYTES:
            raise ValueError(f"{path} would be over the {MAX_FILE_BYTES}-byte cap readers accept; nothing written")
        _remove_orphans(path)
        paths.write_text_atomic(path, text, mode)
    finally:
        lock.release()
    return path
