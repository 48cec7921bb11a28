"""The report logs of the fusion passes (`fuse_quant`, `fuse_residual`, `fuse_siblings`): each pass appends one
report per graph it runs on, so that tests, benchmarks and users can see what a compile fused and what it left.

A log keeps only the last `limit` reports (a serving process compiles for as long as it lives), so a caller that
wants "the reports of this compile" must not remember a length and slice there: once the log is full the length
stays put and the slice is empty (the full CPU suite filled one after the fusion became the default). It takes a
`mark()` before and reads `since(mark)` after instead: a running count of appends, which the bound does not
reset.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

R = TypeVar("R")


class PassLog(Generic[R]):
    """A bounded, thread-safe, append-only record of one pass's reports, oldest first."""

    def __init__(self, limit: int = 64) -> None:
        self._reports: deque[R] = deque(maxlen=limit)
        self._appended = 0  # every report ever appended, dropped ones included: what a mark counts
        self._lock = threading.Lock()

    def append(self, report: R) -> R:
        """Record `report` (dropping the oldest past the limit); returns it, for the pass to fill in."""
        with self._lock:
            self._reports.append(report)
            self._appended += 1
        return report

    def entries(self) -> list[R]:
        """The reports kept, oldest first (a copy)."""
        with self._lock:
            return list(self._reports)

    def mark(self) -> int:
        """A position to read `since`: the number of reports appended so far."""
        with self._lock:
            return self._appended

    def since(self, mark: int) -> list[R]:
        """The reports appended after `mark` (from `mark()`), oldest first. If more were appended than the log
        keeps, the oldest of them are gone: the list is the kept ones, never a report from before the mark."""
        with self._lock:
            new = self._appended - mark
            if new < 0:
                raise ValueError(f"mark {mark} is ahead of this log ({self._appended} reports appended)")
            return list(self._reports)[len(self._reports) - min(new, len(self._reports)):]
