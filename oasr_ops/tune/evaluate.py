"""`oasr tune evaluate`: regret of config selectors against the measured oracle.

Input: a measurement log (JSONL, one record per arm per point, as ``oasr tune build`` writes it)::

    {"signature": "gemm|op=gemm|dt=half|N=512|K=256", "m": 416, "config": "b32x64x64_w16x32x64_s3",
     "median_s": 6.1e-06, "sigma_s": 1e-07, "n": 9, "weight": 0.013, ...}

and selectors: ``(signature, m) -> config`` callables, or a DB file's entries (``{signature: {"regions": ...}}``)
resolved with the runtime's round-up rule.

Per point (signature, m): oracle = the fastest measured arm; regret(selector) = t(selected) / t(oracle) - 1.
A selected config that was not measured at that point is counted as ``unmeasured`` and left out of the
statistics (its regret is unknown, not zero); a selector answering None is counted as ``uncovered`` and left
out too. Per selector: weighted geomean regret = exp(sum w log(1 + r) / sum w) - 1, p95 (nearest rank,
unweighted: a tail statistic over points, so a rare shape cannot hide behind its weight) and max.

No torch, no GPU.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from ..errors import is_int, is_number
from ..runtime.select import resolve_in_table
from .points import Point

log = logging.getLogger(__name__)

__all__ = [
    "Selector", "PointRegret", "SelectorScore", "read_log", "record_problem", "load_db_entries", "db_entries_of",
    "db_selector", "constant_selector", "as_selector", "evaluate", "format_table", "plot", "register", "handler",
]

SelectorFn = Callable[[str, int], Union[str, None]]
Selector = Union[SelectorFn, Mapping[str, Any]]


# ---------------------------------------------------------------------------------------------- selectors

def _half_alias(signature: str) -> str | None:
    # dt=half serves fp16 and bf16 alike; an exact dt=fp16/dt=bf16 entry wins over it (spec).
    for dt in ("dt=fp16", "dt=bf16"):
        if f"|{dt}|" in f"|{signature}|":
            return "|".join("dt=half" if part == dt else part for part in signature.split("|"))
    return None


def load_db_entries(path: str) -> dict[str, Any]:
    """A DB file's entries: ``{signature: entry}``. Accepts a file with an ``"entries"`` object or a bare
    ``{signature: entry}`` mapping. ValueError naming the file (and the entry) for a file that is not one."""
    with open(path) as f:
        data = json.load(f)
    return db_entries_of(data, path)


def db_entries_of(data: Any, where: str) -> dict[str, Any]:
    """`load_db_entries` on a parsed document. Every entry's region table is checked here (ValueError naming
    `where`, the signature and the region): the selector compares each ``m_hi`` with M, so a region that is not
    ``[m_hi, config]`` would otherwise surface as a TypeError in the middle of scoring."""
    if isinstance(data, Mapping) and isinstance(data.get("entries"), Mapping):
        entries = dict(data["entries"])
    elif isinstance(data, Mapping):
        entries = {k: v for k, v in data.items() if "|" in k}
    else:
        raise ValueError(f"{where}: not a tuning DB file")
    from ..runtime.db_entries import region_rows_problem

    for sig, e in entries.items():
        table = e.get("regions") if isinstance(e, Mapping) else e
        if table is None:
            continue  # an entry without regions (exact points only) answers the miss
        why = region_rows_problem(table)
        if why is not None:
            raise ValueError(f"{where}: entry {sig!r}: {why}")
    return entries


def db_selector(entries: Mapping[str, Any], miss: str | None = None) -> SelectorFn:
    """Selector over a DB file's entries. An entry is ``{"regions": [[m_hi, cfg], ...]}`` or a bare region list.
    Lookup: the signature's own entry, then its ``dt=half`` alias for dt=fp16/bf16, each rounding M up.
    A signature without an entry, or an M above the last region of an entry with no catch-all, answers
    ``miss`` (None: uncovered; ``"default"``: what the runtime ends at when no tier answers)."""
    resolve = resolve_in_table

    def select(signature: str, m: int) -> str | None:
        # The dtype-specific entry first, then dt=half; each falls through where it does not cover M
        # (database.chain's order within one tier).
        for sig in (signature, _half_alias(signature)):
            e = entries.get(sig) if sig else None
            if e is None:
                continue
            table = e.get("regions") if isinstance(e, Mapping) else e
            got = resolve(list(table or []), int(m))
            if got is not None and got != "auto":  # select.resolve_in_table says "auto" for "not covered"
                return got
        return miss

    return select


def constant_selector(config: str) -> SelectorFn:
    """Always ``config`` (e.g. ``"default"``, ``"torch"``)."""
    return lambda signature, m: config


def as_selector(obj: Selector, miss: str | None = None) -> SelectorFn:
    """A callable is used as is; a mapping is a DB's entries (or a whole DB file's JSON with "entries")."""
    if callable(obj):
        return obj
    if isinstance(obj, Mapping):
        entries = obj["entries"] if isinstance(obj.get("entries"), Mapping) else obj
        return db_selector(entries, miss=miss)
    raise TypeError(f"not a selector: {type(obj).__name__}")


# ---------------------------------------------------------------------------------------------- the log

def record_problem(r: Any) -> str | None:
    """Why a measurement-log record cannot be read, or None. A log is appended to by builds and may be edited or
    cut by hand: the fields the readers convert are checked where present (a record lacking one is not a
    measurement and is skipped by the readers), so a bad value is named here rather than raised from a float()
    deep in scoring or partitioning. ``signature`` and ``config`` strings, ``m`` an integer > 0, ``median_s``
    and ``sigma_s`` numbers or null (a failed arm), ``weight`` a finite number >= 0 or null, ``eager_fraction``
    in [0, 1] or null, ``n`` an integer >= 0, ``validators`` an object or null."""
    if not isinstance(r, dict):
        return f"not a JSON object (a measurement record), got {type(r).__name__}"

    def got(key: str) -> str:
        return f"got {json.dumps(r[key])[:60]}"

    for key in ("signature", "config"):
        if key in r and not isinstance(r[key], str):
            return f"{key} must be a string, {got(key)}"
    if "m" in r and not (is_int(r["m"]) and r["m"] > 0):
        return f"m must be an integer > 0, {got('m')}"
    for key in ("median_s", "sigma_s"):
        if r.get(key) is not None and not is_number(r[key]):
            return f"{key} must be a number of seconds, {got(key)}"
    if r.get("weight") is not None and not (is_number(r["weight"]) and 0 <= r["weight"] < math.inf):
        return f"weight must be a finite number >= 0, {got('weight')}"
    if r.get("eager_fraction") is not None and not (is_number(r["eager_fraction"])
                                                     and 0 <= r["eager_fraction"] <= 1):
        return f"eager_fraction must be in [0, 1], {got('eager_fraction')}"
    if "n" in r and r["n"] is not None and not (is_int(r["n"]) and r["n"] >= 0):
        return f"n must be an integer >= 0, {got('n')}"
    if r.get("validators") is not None and not isinstance(r["validators"], dict):
        return f"validators must be an object, {got('validators')}"
    return None


def read_log(path: str, check: bool = False) -> list[dict[str, Any]]:
    """Records of a JSONL log; blank lines skipped; a malformed line is a ValueError naming the line. `check`:
    also every record `record_problem` refuses (`oasr tune evaluate`; other readers filter what they use)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
            except RecursionError:
                raise ValueError(f"{path}:{i}: JSON nested too deeply") from None
            why = record_problem(r) if check else None
            if why is not None:
                raise ValueError(f"{path}:{i}: {why}")
            out.append(r)
    return out


def _points(records: Iterable[Mapping[str, Any]]) -> list[tuple[Point, dict[str, float]]]:
    """Group records by (signature, m): each point with its measured arms ``{config: seconds}``. A later record
    of the same arm replaces an earlier one (the log is appended to, so the last measurement is the current
    one). Records without a finite positive median (a failed arm) are skipped. The point weight is the largest
    weight any of its records carries."""
    pts: dict[tuple[str, int], tuple[Point, dict[str, float]]] = {}
    for r in records:
        try:
            sig, m, cfg = str(r["signature"]), int(r["m"]), str(r["config"])
            t = float(r["median_s"])
        except (KeyError, TypeError, ValueError):
            continue
        p, arms = pts.setdefault((sig, m), (Point(m, signature=sig), {}))
        w = r.get("weight")
        if w is not None:
            p.weight = max(p.weight, float(w))
        if math.isfinite(t) and t > 0:
            arms[cfg] = t
    return [pa for _, pa in sorted(pts.items()) if pa[1]]


# ---------------------------------------------------------------------------------------------- scoring

@dataclass
class PointRegret:
    signature: str
    m: int
    weight: float
    config: str | None
    oracle: str
    regret: float | None  # None: unmeasured or uncovered


@dataclass
class SelectorScore:
    """Statistics over the points where the selected config was measured. ``n``: such points; ``unmeasured``:
    points whose selected config has no measurement there; ``uncovered``: points the selector answered None.
    geomean / p95 / max are None when n == 0."""

    n: int
    unmeasured: int
    uncovered: int
    geomean: float | None
    p95: float | None
    max: float | None
    points: list[PointRegret]

    def as_dict(self, per_point: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"n": self.n, "unmeasured": self.unmeasured, "uncovered": self.uncovered,
                             "geomean": self.geomean, "p95": self.p95, "max": self.max}
        if per_point:
            d["points"] = [vars(p).copy() for p in self.points]
        return d


def _nearest_rank(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def _score(pts: list[tuple[Point, dict[str, float]]], select: SelectorFn) -> SelectorScore:
    rows: list[PointRegret] = []
    unmeasured = uncovered = 0
    # Unit weights when the log carries none, so an unweighted log still gets a (plain) geomean.
    unit = not any(p.weight > 0 for p, _ in pts)
    for p, arms in pts:
        oracle = min(arms, key=lambda c: (arms[c], c))
        cfg = select(p.signature, p.m)
        w = 1.0 if unit else p.weight
        if cfg is None:
            uncovered += 1
            rows.append(PointRegret(p.signature, p.m, w, None, oracle, None))
        elif cfg not in arms:
            unmeasured += 1
            rows.append(PointRegret(p.signature, p.m, w, cfg, oracle, None))
        else:
            rows.append(PointRegret(p.signature, p.m, w, cfg, oracle, arms[cfg] / arms[oracle] - 1.0))
    scored = [r for r in rows if r.regret is not None]
    if not scored:
        return SelectorScore(0, unmeasured, uncovered, None, None, None, rows)
    regrets = [r.regret for r in scored]  # type: ignore[misc]
    wsum = sum(r.weight for r in scored)
    if wsum > 0:
        gm = math.exp(sum(r.weight * math.log1p(r.regret) for r in scored) / wsum) - 1.0  # type: ignore[arg-type]
    else:  # every scored point has weight 0 in a weighted log: fall back to the plain geomean
        gm = math.exp(sum(math.log1p(x) for x in regrets) / len(regrets)) - 1.0
    return SelectorScore(len(scored), unmeasured, uncovered, gm, _nearest_rank(regrets, 0.95), max(regrets), rows)


def evaluate(log_records: Iterable[Mapping[str, Any]], selectors: Mapping[str, Selector],
             miss: str | None = None) -> dict[str, Any]:
    """Score every selector on the log's points. Returns
    ``{"points": <number of (signature, m) points>, "selectors": {name: SelectorScore}}``
    (``SelectorScore.as_dict()`` for JSON). Mappings are DB entries, resolved round-up with ``miss`` on a miss.
    """
    pts = _points(log_records)
    return {"points": len(pts),
            "selectors": {name: _score(pts, as_selector(sel, miss=miss)) for name, sel in selectors.items()}}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def format_table(result: Mapping[str, Any]) -> str:
    """A plain-text table, one row per selector, in the result's order."""
    head = ("selector", "points", "geomean", "p95", "max", "unmeasured", "uncovered")
    rows = [head]
    for name, s in result["selectors"].items():
        rows.append((name, str(s.n), _pct(s.geomean), _pct(s.p95), _pct(s.max), str(s.unmeasured),
                     str(s.uncovered)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + f"\n({result['points']} measured points; regret = t(selected) / t(oracle) - 1)"


def plot(result: Mapping[str, Any], path: str) -> bool:
    """Regret vs M, one panel per signature, one line per selector (log-M axis), written to ``path``. Returns
    False (and says why on stderr) when matplotlib is not installed; True when written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("plot skipped: matplotlib is not installed (pip install oasr_ops[plot]); %s not written", path)
        return False
    sigs = sorted({p.signature for s in result["selectors"].values() for p in s.points})
    if not sigs:
        log.warning("plot skipped: no measured points; %s not written", path)
        return False
    cols = min(3, len(sigs))
    rows = -(-len(sigs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3 * rows), squeeze=False)
    for ax, sig in zip(axes.flat, sigs):
        for name, s in result["selectors"].items():
            pts = sorted((p.m, p.regret) for p in s.points if p.signature == sig and p.regret is not None)
            if pts:
                ax.plot([m for m, _ in pts], [100.0 * r for _, r in pts], marker=".", label=name)
        ax.set_title(sig.split("|", 1)[-1], fontsize=8)  # without the family prefix: short titles
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(sigs):]:
        ax.axis("off")
    axes[0][0].set_ylabel("regret vs oracle (%)")
    axes[-1][0].set_xlabel("M")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------- CLI

def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``evaluate`` to an ``oasr tune`` subparsers object; the parser's default ``func`` is ``handler``."""
    p = subparsers.add_parser(
        "evaluate", help="regret of selectors (DB files, default, torch) against the measured oracle",
        description="Score DB files and the constant default/torch selectors against a measurement log.")
    p.add_argument("--log", required=True, action="append", metavar="LOG",
                   help="measurement log (JSONL); repeat to concatenate logs")
    p.add_argument("--db", action="append", default=[], metavar="NAME=PATH",
                   help="a tuning DB file to score under NAME (repeatable)")
    p.add_argument("--miss", default="default",
                   help="config a DB selector answers where it has no entry/region (default: 'default', as the "
                        "runtime ends); 'none' counts such points as uncovered instead")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write a regret plot (needs matplotlib: pip install oasr_ops[plot]; default: no plot)")
    p.add_argument("--arch", help="arch family whose lane default the `default` sentinel means (default: this GPU, "
                                  "else sm90)")
    p.add_argument("--default-config", help="config id the `default` sentinel means (overrides --arch)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.set_defaults(func=handler)
    return p


def _native_default(arch: str | None) -> Callable[[str], Union[str, None]]:
    """signature -> the default config id of its family's native lane on `arch` (None: no such lane)."""
    from ..runtime.registry import native_lane
    from ..runtime.arch import current_arch_family, normalize_arch

    a = normalize_arch(arch) if arch else (current_arch_family() or "sm90")

    def default_of(sig: str) -> str | None:
        lane = native_lane(a, sig.split("|", 1)[0])
        return lane.default.id if lane else None
    return default_of


def _sentinel_as(fn: SelectorFn, sentinel: str, config: Callable[[str], Union[str, None]]) -> SelectorFn:
    def wrapped(sig: str, m: int):
        c = fn(sig, m)
        return (config(sig) or c) if c == sentinel else c
    return wrapped


def handler(args: argparse.Namespace) -> int:
    """Run ``oasr tune evaluate``. 0 on success; bad input raises `UsageError` (the CLI's exit 2) before
    anything is written."""
    from ..errors import UsageError, existing_file, json_file, writable_output

    selectors: dict[str, Selector] = {}
    miss = None if str(args.miss).lower() == "none" else args.miss
    if args.plot:
        writable_output(args.plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install oasr_ops[plot]") from None
    records: list[dict[str, Any]] = []
    for path in args.log:
        existing_file(path, "--log")
        try:
            got = read_log(path, check=True)
        except UnicodeDecodeError:  # a ValueError whose message does not name the file
            raise UsageError(f"--log {path}: not UTF-8 text") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--log {e}") from None
        if not _points(got):  # a census, a manifest, an empty file: scoring it would print an empty table
            raise UsageError(f"--log {path}: no measured arm (records with signature, m, config and median_s, as "
                             "`oasr tune build --log` writes)")
        records.extend(got)
    log_families = {str(r.get("signature", "")).split("|", 1)[0] for r in records}
    for spec in args.db:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--db expects NAME=PATH, got {spec!r}")
        if name in selectors:
            raise UsageError(f"--db name {name!r} given twice")
        path = os.path.expanduser(path)  # `NAME=~/...`: the shell expands no ~ inside a word (sh, quotes)
        doc = json_file(path, "--db")  # UsageError for a missing, non-UTF-8, invalid or too deeply nested file
        try:
            entries = db_entries_of(doc, f"--db {path}")
        except ValueError as e:
            raise UsageError(str(e)) from None
        families = {sig.split("|", 1)[0] for sig in entries}
        if entries and not families & log_families:  # would score exactly like the `default` arm, silently
            raise UsageError(f"--db {path}: its entries are {', '.join(sorted(families))} signatures; the log "
                             f"measured {', '.join(sorted(log_families))} (give the log of that family's build)")
        selectors[name] = db_selector(entries, miss=miss)
    # The arch the `default` sentinel is read on: checked here, before any scoring (`OASR_ARCH` stands in for a
    # missing --arch, so a bad value there is named as such).
    if not args.default_config:
        try:
            native_default = _native_default(args.arch)
        except ValueError as e:
            raise UsageError(f"--arch {args.arch}: {e}" if args.arch else f"OASR_ARCH: {e}") from None
    # The constant baselines are always scored; a --db named like one of them takes its place.
    for const in ("default", "torch"):
        selectors.setdefault(const, constant_selector(const))
    # A build log names the default arm by its config id: score the `default` sentinel as that id (unless
    # the log recorded an arm literally named `default`).
    default_of = (lambda sig: args.default_config) if args.default_config else native_default
    if not any(r.get("config") == "default" for r in records):
        selectors = {name: _sentinel_as(fn, "default", default_of) for name, fn in
                     ((n, as_selector(sel, miss=miss)) for n, sel in selectors.items())}
    result = evaluate(records, selectors, miss=miss)
    if args.plot and not any(s.points for s in result["selectors"].values()):
        raise UsageError(f"--plot: no measured points in {', '.join(args.log)}; nothing to plot")
    if args.json:
        print(json.dumps({"points": result["points"],
                          "selectors": {k: v.as_dict() for k, v in result["selectors"].items()}}, indent=1))
    else:
        print(format_table(result))
    if args.plot and plot(result, args.plot):
        if args.json:  # stdout is one JSON document
            log.info("plot written: %s", args.plot)
        else:
            print(f"plot written: {args.plot}")
    return 0
