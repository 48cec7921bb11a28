"""How selections were counted: calls and resolutions per family, op and tier (the selector's report).

Read from the selector's memo (`runtime.select`): every call is counted under the tier that answered; a
resolution is one memo miss (one per distinct shape per DB epoch). Past epochs are folded into totals on reload.
"""
from __future__ import annotations

from . import select as _sel  # module attributes: the selector rebinds its memo on every reload


def tuning_report(print_: bool = False) -> str | dict:
    """Calls per tier, per family and op, since import: ``{family: {op: {tier: calls}}}``.

    With ``print_=True`` the report is printed (with resolution counts: one per shape per epoch) and the text
    returned.
    """
    agg: dict[tuple[str, str, str], list[int]] = {}
    for (fam, op, tier, _served), (calls, shapes) in _counts().items():
        t = agg.setdefault((fam, op, tier), [0, 0])
        t[0] += calls
        t[1] += shapes
    out: dict[str, dict[str, dict[str, int]]] = {}
    for (fam, op, tier), (calls, _shapes) in sorted(agg.items()):
        out.setdefault(fam, {}).setdefault(op, {})[tier] = calls
    if not print_:
        return out
    lines = ["tuning report (calls per tier; resolutions, one per shape per epoch, in parentheses)"]
    for fam, ops in out.items():
        for op, tiers in ops.items():
            parts = [f"{t}={tiers[t]} ({agg[(fam, op, t)][1]})" for t in _sel.TIER_NAMES if t in tiers]
            lines.append(f"  {fam}/{op}: " + " ".join(parts))
    if len(lines) == 1:
        lines.append("  no selections yet")
    text = "\n".join(lines)
    print(text)
    return text


def _counts() -> dict[tuple[str, str, str, bool], list[int]]:
    """[calls, resolutions] per (family, op, tier, served) since import: past epochs and the live memo."""
    with _sel._LOCK:
        agg = {key: list(v) for key, v in _sel._TOTALS.items()}
        for cell in _sel._MEMO.values():
            t = agg.setdefault((cell.family, cell.op, cell.sel.tier, cell.served), [0, 0])
            t[0] += cell.calls
            t[1] += 1
    return agg


def resolution_counts(family: str) -> dict[str, dict[str, int]]:
    """`serve_config`'s resolutions (one per distinct shape per DB epoch) of `family` since import (or its last
    `reset_selection`): ``{op: {tier: n}}``."""
    out: dict[str, dict[str, int]] = {}
    for (fam, op, tier, served), (_calls, shapes) in sorted(_counts().items()):
        if fam == family and served:
            out.setdefault(op, {})[tier] = shapes
    return out


def reset_counts() -> None:
    """Forget the resolution counts (tests, or a report per phase)."""
    with _sel._LOCK:
        _sel._TOTALS.clear()
        for cell in _sel._MEMO.values():
            cell.calls = 0
