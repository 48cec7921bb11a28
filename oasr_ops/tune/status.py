"""`oasr tune status` and `oasr tune diff`.

`register(subparsers)` adds both subcommands to an argparse subparsers object; each sets ``func=handler`` with
``handler(args) -> int`` (the exit code).

* ``status [--arch A] [--json]``: tier directories, files loaded / skipped (and why), problems inside loaded
  files, stale entries with the soft validators that differ, resolution counts of this process. Exit 0.
* ``diff A.json B.json [--json]``: per signature, regions added / removed / changed, configs whose parameters
  changed, evidence keys added / removed / changed. Exit 0 when equal, 1 when different, 2 when a file cannot be
  read as a tuning file (size-capped like the database, never executed). ``status`` exits 2 on a bad --arch.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import database as _db


# ------------------------------------------------------------------------------------------------- status


def status_data(arch: str | None = None) -> dict[str, Any]:
    from ..runtime.select_report import tuning_report

    rep = _db.report(arch)
    rep["resolutions"] = tuning_report(print_=False)
    return rep


def _status_text(d: dict[str, Any]) -> str:
    lines = [f"epoch {d['epoch']}; arch {', '.join(d['archs']) or '(none found)'}"]
    for tier in ("user", "system"):
        where = d["tiers"][tier]
        found = "found" if d["tiers_found"][tier] else ("disabled" if where is None else "absent")
        lines.append(f"  {tier:6s} tier: {where or 'off'} ({found})")
    if not d["files"]:
        lines.append("  no tuning files")
    for f in d["files"]:
        if f["status"] == "loaded":
            lines.append(f"  loaded  [{f['tier']}] {f['path']}: {f['entries']} entries, lane {f['lane']}")
            for p in f["problems"]:
                lines.append(f"      skipped: {p}")
        else:
            lines.append(f"  SKIPPED [{f['tier']}] {f['path']}: {f['reason']}")
    if d["stale"]:
        lines.append(f"  {len(d['stale'])} stale entries:")
        for s in d["stale"]:
            lines.append(f"      [{s['tier']}] {s['signature']}: {', '.join(s['validators'])} differ")
    else:
        lines.append("  no stale entries")
    res = d["resolutions"]
    if res:
        lines.append("  resolutions (calls per tier):")
        for fam, ops in res.items():
            for op, tiers in ops.items():
                lines.append(f"      {fam}/{op}: " + " ".join(f"{t}={c}" for t, c in tiers.items()))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    try:
        d = status_data(getattr(args, "arch", None))
    except ValueError as e:  # a misspelt --arch
        raise UsageError(f"--arch: {e}") from None
    if getattr(args, "json", False):
        print(json.dumps(d, indent=1, default=str))
    else:
        print(_status_text(d))
    return 0


# --------------------------------------------------------------------------------------------------- diff


def _load_for_diff(path: str) -> dict[str, Any]:
    """A tuning DB file's document, or UsageError. A tuning file is a JSON object with an integer ``schema``,
    string ``kernel_family`` and ``arch_family`` and an ``entries`` object (any other JSON is refused, so a
    census or a log given by mistake is not "a file with no entries")."""
    from ..errors import UsageError

    doc, why = _db._read_json(Path(path))
    if why is not None:
        raise UsageError(f"{path}: {'no such file' if why == 'absent' else why}")
    if not (isinstance(doc, dict) and type(doc.get("schema")) is int and isinstance(doc.get("kernel_family"), str)
            and isinstance(doc.get("arch_family"), str) and isinstance(doc.get("entries"), dict)):
        raise UsageError(f"{path}: not a tuning DB file (needs schema, kernel_family, arch_family, entries)")
    return doc


def _regions_map(e: Any) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    regions = e.get("regions") if isinstance(e, dict) else None
    for r in regions if isinstance(regions, list) else []:
        if isinstance(r, list) and len(r) == 2 and (r[0] is None or type(r[0]) is int):
            out[r[0]] = r[1]
    pts = e.get("points") if isinstance(e, dict) else None
    for key, cfg in (pts.items() if isinstance(pts, dict) else []):
        out[f"point {key}"] = cfg
    return out


def _sort_key(k: Any) -> tuple:
    return (0, k, "") if isinstance(k, int) else (1, 0, str(k))


def diff_docs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Structured differences between two tuning documents (B relative to A)."""
    out: dict[str, Any] = {"header": {}, "signatures": {}, "configs": {}}
    for key in ("schema", "kernel_family", "arch_family", "lane", "validators", "model"):
        if a.get(key) != b.get(key):
            out["header"][key] = [a.get(key), b.get(key)]
    ea, eb = a.get("entries") or {}, b.get("entries") or {}
    for sig in sorted(set(ea) | set(eb)):
        if sig not in eb:
            out["signatures"][sig] = {"entry": "removed"}
            continue
        if sig not in ea:
            out["signatures"][sig] = {"entry": "added", "regions": _fmt_regions(_regions_map(eb[sig]))}
            continue
        ra, rb = _regions_map(ea[sig]), _regions_map(eb[sig])
        d: dict[str, Any] = {}
        added = {k: rb[k] for k in sorted(set(rb) - set(ra), key=_sort_key)}
        removed = {k: ra[k] for k in sorted(set(ra) - set(rb), key=_sort_key)}
        changed = {k: [ra[k], rb[k]] for k in sorted(set(ra) & set(rb), key=_sort_key) if ra[k] != rb[k]}
        if added:
            d["regions_added"] = _fmt_keys(added)
        if removed:
            d["regions_removed"] = _fmt_keys(removed)
        if changed:
            d["regions_changed"] = _fmt_keys(changed)
        va = ea[sig].get("evidence") if isinstance(ea[sig], dict) else None
        vb = eb[sig].get("evidence") if isinstance(eb[sig], dict) else None
        va, vb = (va if isinstance(va, dict) else {}), (vb if isinstance(vb, dict) else {})
        ev = {
            "added": sorted(set(vb) - set(va)),
            "removed": sorted(set(va) - set(vb)),
            "changed": {k: [va[k], vb[k]] for k in sorted(set(va) & set(vb)) if va[k] != vb[k]},
        }
        if any(ev.values()):
            d["evidence"] = ev
        for key in ("source", "soft", "regions_eager"):
            if isinstance(ea[sig], dict) and isinstance(eb[sig], dict) and ea[sig].get(key) != eb[sig].get(key):
                d[key] = [ea[sig].get(key), eb[sig].get(key)]
        if d:
            out["signatures"][sig] = d
    ca, cb = a.get("configs") or {}, b.get("configs") or {}
    if isinstance(ca, dict) and isinstance(cb, dict):
        for cid in sorted(set(ca) & set(cb)):
            if ca[cid] != cb[cid]:
                out["configs"][cid] = [ca[cid], cb[cid]]
    return out


def _fmt_key(k: Any) -> str:
    return "null" if k is None else str(k)


def _fmt_keys(d: dict[Any, Any]) -> dict[str, Any]:
    return {_fmt_key(k): v for k, v in d.items()}


def _fmt_regions(r: dict[Any, Any]) -> dict[str, Any]:
    return _fmt_keys({k: r[k] for k in sorted(r, key=_sort_key)})


def _is_empty(d: dict[str, Any]) -> bool:
    return not (d["header"] or d["signatures"] or d["configs"])


def _diff_text(d: dict[str, Any], a: str, b: str) -> str:
    if _is_empty(d):
        return f"{a} and {b}: no differences"
    lines = [f"--- {a}", f"+++ {b}"]
    for key, (x, y) in d["header"].items():
        lines.append(f"  {key}: {json.dumps(x)} -> {json.dumps(y)}")
    for sig, e in d["signatures"].items():
        lines.append(f"  {sig}")
        if e.get("entry") == "removed":
            lines.append("      entry removed")
            continue
        if e.get("entry") == "added":
            lines.append("      entry added: " + ", ".join(f"{k}: {v}" for k, v in e["regions"].items()))
            continue
        for k, v in e.get("regions_added", {}).items():
            lines.append(f"      + m_hi {k}: {v}")
        for k, v in e.get("regions_removed", {}).items():
            lines.append(f"      - m_hi {k}: {v}")
        for k, (x, y) in e.get("regions_changed", {}).items():
            lines.append(f"      ~ m_hi {k}: {x} -> {y}")
        ev = e.get("evidence")
        if ev:
            lines.append(f"      evidence: +{len(ev['added'])} -{len(ev['removed'])} ~{len(ev['changed'])}")
            for k, (x, y) in ev["changed"].items():
                lines.append(f"        {k}: {json.dumps(x)[:60]} -> {json.dumps(y)[:60]}")
        for key in ("source", "soft", "regions_eager"):
            if key in e:
                lines.append(f"      {key}: {json.dumps(e[key][0])[:60]} -> {json.dumps(e[key][1])[:60]}")
    for cid, (x, y) in d["configs"].items():
        lines.append(f"  config {cid}: parameters changed")
    return "\n".join(lines)


def cmd_diff(args: argparse.Namespace) -> int:
    a, b = _load_for_diff(args.a), _load_for_diff(args.b)
    d = diff_docs(a, b)
    if getattr(args, "json", False):
        print(json.dumps(d, indent=1, default=str))
    else:
        print(_diff_text(d, args.a, args.b))
    return 0 if _is_empty(d) else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("status", help="which tuning tiers and files are loaded, which entries are stale",
                              description="Tier directories, tuning files loaded or skipped (and why), stale "
                                          "entries, and this process's resolution counts.")
    p.add_argument("--arch", default=None, help="arch family, e.g. sm90 (default: this GPU or OASR_ARCH)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
    d = subparsers.add_parser("diff", help="compare two tuning files per signature",
                              description="Regions, configs and evidence that differ between two tuning DB "
                                          "files. Exit 0 when equal, 1 when different, 2 on a bad file.")
    d.add_argument("a", metavar="A.json", help="the old tuning DB file")
    d.add_argument("b", metavar="B.json", help="the new tuning DB file")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_diff)
