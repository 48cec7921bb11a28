"""The fusion passes' bounded report logs: what a compile added is found after the bound dropped old reports."""
from __future__ import annotations

import threading

import pytest

from oasr_ops.inductor.pass_log import PassLog


def test_since_a_mark_survives_a_full_log():
    log: PassLog[int] = PassLog(limit=4)
    for i in range(10):  # full: a remembered length (4) would slice nothing from here on
        log.append(i)
    mark = log.mark()
    assert log.since(mark) == []
    log.append(10)
    log.append(11)
    assert log.since(mark) == [10, 11]
    assert log.entries() == [8, 9, 10, 11]


def test_since_never_returns_a_report_from_before_the_mark():
    log: PassLog[str] = PassLog(limit=3)
    log.append("old")
    mark = log.mark()
    for r in "abcde":  # more than the log keeps: the oldest new ones are gone, and so is "old"
        log.append(r)
    assert log.since(mark) == ["c", "d", "e"]
    assert log.since(0) == ["c", "d", "e"]


def test_a_mark_ahead_of_the_log_is_an_error():
    log: PassLog[int] = PassLog()
    with pytest.raises(ValueError, match="ahead of this log"):
        log.since(1)


def test_appends_from_threads_are_all_counted():
    log: PassLog[int] = PassLog(limit=8)
    mark = log.mark()
    threads = [threading.Thread(target=lambda: [log.append(j) for j in range(500)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log.mark() - mark == 2000 and len(log.since(mark)) == 8


def test_the_passes_log_through_pass_logs():
    from oasr_ops.inductor import fuse_quant, fuse_residual, fuse_siblings

    for log, read in ((fuse_quant.FUSE_LOG, fuse_quant.fuse_log), (fuse_residual.RESIDUAL_LOG,
                      fuse_residual.residual_log), (fuse_siblings.SIBLING_LOG, fuse_siblings.sibling_log)):
        assert isinstance(log, PassLog) and read() == log.entries()
