"""A build's measurement log, read back without a GPU: `oasr tune build --from-log` (partition it again with
the current rules, validation points included) and the cost model fitted on it (the tuning file's ``model``
section). Logs written before the ``validation`` / ``must_tune`` / ``pruned`` fields load unchanged: their
points are all partition points, as they were (and no note is starred).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..runtime.database import parse_signature
from .candidates import candidates_for, fallback_id, pseudo_arms
from .points import Point
from .region_guard import guard_signature
from .serving_regions import build_step
from .validation import partition_validated

__all__ = ["fit_model", "model_from_log", "log_tables", "partition_logged", "entries_from_log"]


def fit_model(records: list[dict[str, Any]], arch: str) -> dict[str, Any] | None:
    """The tuning file's ``model`` section fitted on measurement records (tune.calibrate.fit against the arch's
    reference profile), or None where the cost model covers none of them (calibrate fits the gemm family) or
    the arch has no reference SKU."""
    from ..runtime import cost_model
    from ..runtime.arch_profile import reference_profile
    from .calibrate import fit

    try:
        profile = reference_profile(arch)
    except ValueError:
        return None
    cal = fit(records, profile)
    if not cal.meta.get("records"):
        return None
    return cost_model.to_json(cal)


def model_from_log(log_path: str | Path, family: str, arch: str) -> dict[str, Any] | None:
    """`fit_model` on the records of `family` in a measurement log (None if the log is missing)."""
    from .evaluate import read_log

    try:
        recs = read_log(str(log_path))
    except OSError:
        return None
    return fit_model([r for r in recs if str(r.get("signature", "")).startswith(family + "|")], arch)


Tables = dict[str, dict[int, dict[str, Any]]]


def log_tables(records: Any) -> tuple[Tables, dict[str, dict[int, float]], dict[str, dict[str, Any]],
                                      dict[str, str]]:
    """A measurement log's records as per-signature tables ``{m: {config: (median_s, sigma_s, n)}}`` (the last
    record of an arm at a point wins), weights, held-out sets and L2 states. ``held[sig]``: ``{"validation":
    [Ms], "must_tune": [Ms], "l2": state}``. Records without a measurement are skipped."""
    from collections import defaultdict

    times: Tables = defaultdict(lambda: defaultdict(dict))
    weights: dict[str, dict[int, float]] = defaultdict(dict)
    held: dict[str, dict[str, Any]] = defaultdict(lambda: {"validation": set(), "must_tune": set(), "l2": "cold"})
    l2: dict[str, str] = {}
    for r in records:
        if "config" not in r or "median_s" not in r:
            continue
        sig, m = r["signature"], int(r["m"])
        times[sig][m][r["config"]] = (r["median_s"], r.get("sigma_s", 0.0), r.get("n", 1))
        weights[sig][m] = float(r.get("weight", 1.0))
        l2[sig] = r.get("l2", "cold")
        if r.get("validation"):
            held[sig]["validation"].add(m)
        if r.get("must_tune"):
            held[sig]["must_tune"].add(m)
    for sig in times:
        held[sig]["l2"] = l2[sig]
    return ({s: dict(t) for s, t in sorted(times.items())}, dict(weights), dict(held), l2)


def partition_logged(sig: str, table: dict[int, dict[str, Any]], weights: dict[int, float], held: dict[str, Any],
                     arch: str, min_speedup: float, max_loss: float | None, fallback: str | None = None,
                     charged: bool = False) -> dict[str, Any]:
    """One signature's entry from a logged table, exactly as `measure_signature` partitions it."""
    parts = parse_signature(sig)
    cands = candidates_for(parts, arch) if parts is not None else []
    table = {m: dict(row) for m, row in table.items()}
    # A pseudo-arm is whatever tile the *current* rule picks, timed by its own record at that point: a
    # refitted heuristic is partitioned against its own choices, not the ones the log was measured with.
    for c in pseudo_arms(cands):
        for m, row in table.items():
            tile = c.config_at(Point(m, n=parts.n, k=parts.k, op=parts.op, family=parts.family))
            if tile in row:
                row[c.id] = row[tile]
    fb = fallback or fallback_id(cands)
    v = partition_validated(table, weights, sorted(held.get("validation", ())),
                            fallback=fb, min_speedup=min_speedup, max_loss=max_loss,
                            starred=sorted(held.get("must_tune", ())),
                            evidence_extra={m: {"_l2": held.get("l2", "cold")} for m in table})
    return build_step(guard_signature(v.partition.entry(source="aot"), table, fb, sig, arch), sig, charged)


def entries_from_log(log_path: str | Path, opts: Any, fallback: str | None = None, family: str | None = None
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Partition a finished build's measurement log again, without a GPU (a changed partition rule is scored
    and applied offline), validation points included (`partition_validated`, as the build runs it). Uses each
    record's median (the objective), weight and fill/validation/must_tune flags. The fallback arm is the
    signature's family's (its candidates' ``fallback``) unless `fallback` names one. `family`: only that
    family's records (a DB file holds one family; None: every record, as before). The arch is ``opts.arch``
    (sm90 when None): a caller publishing for another arch passes it, or the regions are partitioned against
    the wrong lane's candidates. Returns the entries and the soft validators the log's measurements were taken
    under (None when the log does not say)."""
    recs = []
    stamp: dict[str, Any] | None = None
    with open(log_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if family is not None and not str(r.get("signature", "")).startswith(family + "|"):
                    continue
                stamp = r.get("validators", stamp)
                recs.append(r)
    tables, weights, held, _l2 = log_tables(recs)
    arch = opts.arch or "sm90"
    charged = {r["signature"] for r in recs if (r.get("eager_fraction") or 0) > 0}  # host time in the objective
    out = {sig: partition_logged(sig, table, weights[sig], held[sig], arch, opts.min_speedup, opts.max_loss,
                                 fallback, sig in charged) for sig, table in tables.items()}
    return out, stamp
