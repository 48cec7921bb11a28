"""Regions that hold between measured points (issue 11, item 7): step 7 of the partition (tune/partition.py).

A region's config was chosen at the Ms measured inside it; the DB serves it at every M in between. The build
therefore also measures held-out Ms (``geometric_midpoints`` between consecutive measured Ms: the "validation
points", kept out of the partition's steps 1-6) and checks each region there. Where a region's config is slower
than the fallback at a held-out M by more than ``max_loss`` (the partition's own guard at measured points), that
M joins the partition — the guard then keeps the losing config out of any region holding it, so the DP splits
the region there or the fallback serves it — and the partition runs again, until every held-out M holds.

Pure Python; no torch.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .partition import DEFAULT_MAX_LOSS, Partition, Table, _medians, partition_signature

__all__ = ["MIN_RATIO", "geometric_midpoints", "served_at", "Validated", "partition_validated"]

#: Consecutive measured Ms closer than this get no validation point between them.
MIN_RATIO = 1.2


def geometric_midpoints(ms: Iterable[int], min_ratio: float = MIN_RATIO) -> list[int]:
    """round(sqrt(a * b)) for each pair of consecutive distinct Ms at least `min_ratio` apart, where that lies
    strictly between them: the held-out Ms a build measures to check its regions between the points they were
    chosen at. Ms closer than `min_ratio` (census Ms a few % apart) leave nothing to check between them."""
    s = sorted({int(m) for m in ms if int(m) > 0})
    out = []
    for a, b in zip(s, s[1:]):
        v = int(round(math.sqrt(a * b)))
        if b >= min_ratio * a and a < v < b:
            out.append(v)
    return out


def served_at(regions: Sequence[Sequence[Any]], m: int) -> str | None:
    """The config `regions` serve at M under the DB's round-up rule (None: past the last region, no catch-all)."""
    for m_hi, cfg in regions:
        if m_hi is None or int(m_hi) >= m:
            return str(cfg)
    return None


@dataclass
class Validated:
    """``partition``: the final partition; ``promoted``: held-out Ms where a region's config lost to the
    fallback by more than max_loss (each split its region or handed it to the fallback); ``checks``: per
    held-out M, (served config, fallback time / served time or None when not both were measured)."""

    partition: Partition
    promoted: list[int]
    checks: dict[int, tuple[str | None, float | None]]

    @property
    def splits(self) -> int:
        return len(self.promoted)


def partition_validated(times: Table, weights: Mapping[int, float] | None = None,
                        validation: Collection[int] = (), *, fallback: str = "default",
                        max_loss: float | None = DEFAULT_MAX_LOSS, **kw: Any) -> Validated:
    """`partition_signature` over the measured points that are not in ``validation``, checked at the ones that are.

    A held-out M fails when the config its region serves there (round-up) was measured there and is slower than
    the fallback by more than ``max_loss`` (DEFAULT_MAX_LOSS when None). Failing Ms join the partition's points
    (with their ``weights``) and it runs again — the max_loss guard keeps the losing config out of any region
    holding them, so the region is split there or falls back — until no remaining held-out M fails (at most
    ``len(validation)`` rounds). A held-out M where the served config or the fallback was not measured cannot be
    judged and is left alone. Notes gain one line per held-out M that did not join. With no held-out points this
    is exactly `partition_signature`.
    """
    loss = DEFAULT_MAX_LOSS if max_loss is None else max_loss
    med = _medians(times)
    held = sorted(int(m) for m in validation if int(m) in med and med[int(m)])
    promoted: list[int] = []
    while True:
        use = {m: row for m, row in times.items() if int(m) not in held or int(m) in promoted}
        # a promoted point is only a constraint through the max_loss guard, so it is on once one exists
        part = partition_signature(use, weights, fallback=fallback, max_loss=loss if promoted else max_loss, **kw)
        checks: dict[int, tuple[str | None, float | None]] = {}
        fails = []
        for v in held:
            if v in promoted:
                continue
            cfg = served_at(part.regions, v)
            row = med[v]
            ratio = row[fallback] / row[cfg] if cfg in row and fallback in row else None
            checks[v] = (cfg, ratio)
            if cfg != fallback and ratio is not None and row[cfg] > (1.0 + loss) * row[fallback]:
                fails.append(v)
        if not fails:
            break
        promoted += fails
    for v, (cfg, ratio) in checks.items():
        how = f"{ratio:.2f}x vs {fallback}" if ratio is not None else "not measured here"
        part.notes.append(f"M={v} (held out): {cfg} ({how})")
    return Validated(part, sorted(promoted), checks)
