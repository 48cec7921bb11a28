"""Reading and validating one tuning-DB file (the format is described in `oasr_ops.runtime.database`).

`read_document` reads a file under the size cap and parses it in a fresh thread (a fixed nesting budget); `load_file` checks the
hard validators and the header and returns a `LoadedFile` whose `entries` are validated lazily, one signature at a
time, when first looked up (a file of 165k entries costs one JSON parse, not 165k entry validations, before its
first lookup). Files of at most `EAGER_ENTRIES` entries are validated whole at load, so their problems are known
(and warned) at once. Problems are aggregated: at most one `TuningDBWarning` per file per epoch, with the count
and the first few reasons; `report()` (``oasr tune status``) validates every entry and lists every problem.

Limits (each documented in the reader's docstring): `MAX_FILE_BYTES` (stat before reading); nesting: the parse runs
in a fresh thread, so whether a file parses does not depend on the caller's stack depth, then the header and each
served entry field are checked iteratively against `MAX_DEPTH`; `MAX_ENTRIES` entries per file (the rest skipped
with one warning). Readers keep only the served fields of entries (regions, points, soft, source), not evidence.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
import stat as _stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..configs import SENTINELS
from . import registry as _registry
from . import validators as _val
from .db_entries import (MAX_DEPTH, Entries, Entry, FileReport, Problems, _short, check_config,  # noqa: F401
                         in_fresh_thread, parse_entry, too_deep)

SCHEMA_VERSION = _val.SCHEMA_VERSION
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 200_000  # a real deployment has hundreds to thousands; bounds a hostile file of tiny entries
EAGER_ENTRIES = 4096  # files up to this many entries are validated whole at load
_SERVED_KEYS = ("regions", "regions_eager", "points", "soft", "source")

_LANE_RE = re.compile(r"^[a-z0-9_]{1,64}$")


class TuningDBWarning(UserWarning):
    """A tuning file, entry or region was skipped (or an entry is unusable here)."""


def lane_obj(name: str | None):
    return _registry.lanes().get(name) if name else None


def expected_lane(arch: str, family: str) -> str | None:
    """The lane a file for (arch, family) must name: the native lane, or None where no lane is registered."""
    lane = _registry.native_lane(arch, family)
    return lane.name if lane is not None else None


# ------------------------------------------------------------------------------------------------ reading


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _slim(doc: Any) -> tuple[Any, dict[tuple[str, str], None]]:
    """For readers: each entry becomes the compact JSON text of its served fields (evidence and notes, most of a
    file, are dropped unread), plus the (config, op) pairs the entries name, for the compile set. Runs while GC is
    paused: the dropped containers are freed unwalked, and strings are never walked by a collection, so a big file
    leaves no millions of containers for every later full collection to traverse."""
    entries = doc.get("entries") if isinstance(doc, dict) else None
    refs: dict[tuple[str, str], None] = {}
    if isinstance(entries, dict):
        encode, keys, out = _COMPACT.encode, _SERVED_KEYS, {}
        for sig, e in entries.items():
            if type(e) is dict:
                e = {k: e[k] for k in keys if k in e}
                op = sig.split("|", 2)[1][3:] if sig.count("|") >= 2 else ""
                points = e.get("points")
                for regions in (e.get("regions"), e.get("regions_eager")):
                    for r in regions if type(regions) is list else ():
                        if type(r) is list and len(r) == 2 and type(r[1]) is str:
                            refs[(r[1], op)] = None
                for cfg in points.values() if type(points) is dict else ():
                    if type(cfg) is str:
                        refs[(cfg, op)] = None
            out[sig] = encode(e)
        doc["entries"] = out
    return doc, refs


@dataclass
class Document:
    """A file read by `read_document`: the parsed JSON (or why not), its sha256 and permission bits."""

    doc: Any = None
    why: str | None = None  # None: parsed; "absent"; else why it cannot be used
    sha256: str = ""
    mode: int | None = None  # permission bits of the file when it exists
    refs: dict[tuple[str, str], None] = field(default_factory=dict)  # slim reads: (config, op) pairs named


def read_document(path: Path, slim: bool = False) -> Document:
    """Read and parse one file. Checks the size before reading a byte. Never raises. `slim`: keep only the served
    fields of each entry (readers; a writer needs everything)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return Document(why="absent")
    except OSError as e:
        return Document(why=f"cannot stat: {e.strerror or e}")
    out = Document(mode=_stat.S_IMODE(st.st_mode))
    if not _stat.S_ISREG(st.st_mode):
        out.why = "not a regular file"
    elif st.st_size > MAX_FILE_BYTES:
        out.why = f"{st.st_size} bytes, over the {MAX_FILE_BYTES}-byte cap"
    if out.why:
        return out
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # the file may have grown since stat
    except OSError as e:
        out.why = f"unreadable: {e.strerror or e}"
        return out
    if len(data) > MAX_FILE_BYTES:
        out.why = f"over the {MAX_FILE_BYTES}-byte cap"
        return out
    out.sha256 = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        out.why = "not UTF-8"
        return out
    del data
    try:
        if slim:
            out.doc, out.refs = in_fresh_thread(lambda: _slim(json.loads(text)))
        else:
            out.doc = in_fresh_thread(lambda: json.loads(text))
    except RecursionError:
        out.why = f"nested deeper than {MAX_DEPTH} levels"
    except ValueError as e:
        out.why = f"not valid JSON ({str(e)[:80]})"
    except MemoryError:
        out.why = "out of memory while parsing"
    return out


def read_json(path: Path) -> tuple[Any, str | None]:
    """(document, None) or (None, why); why is "absent" for a missing file."""
    d = read_document(path)
    return (d.doc, None) if d.why is None else (None, d.why)


def hard_mismatch(doc: Mapping[str, Any], family: str, arch: str, lane_expected: str | None) -> str | None:
    schema = doc.get("schema")
    if type(schema) is not int or schema != SCHEMA_VERSION:
        newer = " (a newer oasr wrote it)" if type(schema) is int and schema > SCHEMA_VERSION else ""
        return f"schema {_short(schema)} != {SCHEMA_VERSION}{newer}"
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
        lobj = lane_obj(lane)
        if lobj is not None and lobj.family != family:
            return f"lane {lane!r} serves family {lobj.family!r}, not {family!r}"
    return None


def header_problem(doc: Any, family: str, arch: str, lane_expected: str | None) -> str | None:
    """Why a parsed document cannot be used as a file for (family, arch, lane) at all, or None."""
    if not isinstance(doc, dict):
        return "top level is not an object"
    bad = hard_mismatch(doc, family, arch, lane_expected)
    if bad is not None:
        return f"hard validator mismatch: {bad}"
    if not isinstance(doc.get("entries", {}), dict):
        return "entries is not an object"
    if too_deep({k: v for k, v in doc.items() if k != "entries"}, MAX_DEPTH):
        return f"nested deeper than {MAX_DEPTH} levels"
    return None


@dataclass
class LoadedFile:
    path: Path
    tier: str
    arch: str
    family: str
    lane: str | None
    validators: dict[str, Any]
    entries: Entries
    model: dict[str, Any] | None
    digest: str  # sha256 of what decides selections: the file's bytes and the code that validates them
    configs: Mapping[str, Any] = field(default_factory=dict)
    refs: Mapping[tuple[str, str], None] = field(default_factory=dict)  # (config, op) pairs the entries name
    _referenced: list[str] | None = None

    def own_validators(self, e: Entry) -> dict[str, Any]:
        return e.soft if e.soft is not None else self.validators

    def referenced_ids(self) -> list[str]:
        """The concrete config ids the entries name that pass the config checks, without validating every entry
        (the compile set is wanted at the first call). An id named only by an entry with a malformed signature (or
        one past the entry cap) may be included: it is still a member of the lane's space."""
        if self._referenced is None:
            memo: dict = {}
            out: dict[str, None] = {}
            for cfg, op in self.refs:
                if cfg not in SENTINELS and check_config(cfg, lane_obj(self.lane), self.configs, op, memo) is None:
                    out[cfg] = None
            self._referenced = list(out)
        return self._referenced


def _code_digest(family: str, lane: Any) -> str:
    """What validation depends on besides the bytes: the family's ops and the lane's config space."""
    ops = ",".join(sorted(_registry.get(family).ops)) if family in _registry.families() else ""
    ids = ",".join(lane.ids()) if lane is not None else ""
    return f"ops={ops};space={ids}"


def load_file(path: Path, tier: str, arch: str, family: str, lane_expected: str | None,
              warn: Callable[[str], None] | None) -> tuple[LoadedFile | None, FileReport | None]:
    """Read one file and check its header. (None, None) when absent; (None, report) when skipped. Never raises."""
    d = read_document(path, slim=True)
    if d.why == "absent":
        return None, None
    rep = FileReport(str(path), tier, arch, family, "skipped")
    why = d.why or header_problem(d.doc, family, arch, lane_expected)
    if why is not None:
        rep.reason = why
        if warn is not None:
            warn(f"tuning DB {path}: skipped: {why}")
        return None, rep
    doc = d.doc
    raw = doc.get("entries", {})
    lazy = len(raw) > EAGER_ENTRIES
    pr = Problems(str(path), warn, f" in the entries validated so far (of {min(len(raw), MAX_ENTRIES)}; the rest"
                                   " are validated when first looked up)" if lazy else "")
    rep.problems = pr.items
    if len(raw) > MAX_ENTRIES:
        pr.add(f"{len(raw)} entries, over the {MAX_ENTRIES}-entry cap: the last {len(raw) - MAX_ENTRIES} skipped")
        raw = dict(itertools.islice(raw.items(), MAX_ENTRIES))
    lane_name = doc.get("lane")
    lane = lane_obj(lane_name)
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
    model = doc.get("model")
    if model is not None and not isinstance(model, dict):
        pr.add("model is not an object; ignored")
        model = None
    entries = Entries(raw, family, lane, table, pr, rep)
    digest = hashlib.sha256(f"{tier}|{arch}|{family}|{lane_name}|{_code_digest(family, lane)}|{d.sha256}"
                            .encode()).hexdigest()
    rep.status, rep.lane = "loaded", lane_name
    if not lazy:
        entries.validate_all()
    pr.flush()
    return LoadedFile(path, tier, arch, family, lane_name, dict(stamp), entries, model, digest, table, d.refs), rep
