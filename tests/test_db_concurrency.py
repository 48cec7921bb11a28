"""Concurrent writers of one user-tier file, and a writer killed mid-write. Real processes, real files."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import time
import warnings

import pytest

from oasr_ops.tune import database as db

N_PROCS = 8
PER_PROC = 100
IDS = ("t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop", "t64x128x64_c1x1_pp", "t128x256x64_c1x1_coop")


def _sig(proc: int, i: int) -> str:
    return f"gemm|op=gemm|dt=half|N={8 * (proc + 1)}|K={8 * (i + 1)}"


def _writer(root: str, proc: int, start) -> None:
    start.wait()  # all writers go at once
    for i in range(PER_PROC):
        db.publish("gemm", {_sig(proc, i): {"regions": [[8 * (i + 1), IDS[i % 4]]], "source": f"p{proc}"}},
                   tier=root, arch="sm90")


def _ctx():
    # fork: the children inherit the imported package (spawn would re-import torch 8 times on 2 cores)
    return mp.get_context("fork")


def test_concurrent_writers_lose_nothing(tmp_path):
    ctx = _ctx()
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), p, start)) for p in range(N_PROCS)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * N_PROCS
    path = tmp_path / "sm90" / "gemm.json"
    doc = json.loads(path.read_text())
    want = {_sig(p, i) for p in range(N_PROCS) for i in range(PER_PROC)}
    assert set(doc["entries"]) == want
    assert set(doc["configs"]) == set(IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lf, rep = db.load_file(path, "user", "sm90", "gemm", "sm90_f16_wgmma", None)
    assert rep.problems == [] and len(lf.entries) == N_PROCS * PER_PROC
    assert not [f for f in os.listdir(path.parent) if f.endswith(".tmp")]


def _looping_writer(root: str) -> None:
    rng = random.Random(os.getpid())
    # a big batch per write so that a kill lands inside json.dump / fsync / rename often
    big = {f"gemm|op=gemm|dt=half|N={8 * (j + 1)}|K=64": {"regions": [[64, IDS[j % 4]], [None, "torch"]],
                                                          "evidence": {"M=64": [0.01, 0.001, 9]}}
           for j in range(1500)}
    while True:
        k = rng.randrange(1, 100000)
        db.publish("gemm", {**big, f"gemm|op=gemm|dt=half|N=8|K={8 * k}": {"regions": [[8, IDS[0]]]}},
                   tier=root, arch="sm90", fresh=rng.random() < 0.3)


def test_sigkill_mid_write_leaves_a_parseable_file(tmp_path):
    ctx = _ctx()
    path = tmp_path / "sm90" / "gemm.json"
    rng = random.Random(1234)
    kills = 0
    for attempt in range(12):
        p = ctx.Process(target=_looping_writer, args=(str(tmp_path),))
        p.start()
        if attempt == 0:
            # The first writer is killed only after one write has landed (polling, up to 120 s): on a loaded
            # 2-core box a publish of 1500 entries can take longer than every random delay below, and then no
            # kill would ever find a file to check. The other eleven are killed at random times as before.
            deadline = time.monotonic() + 120
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        time.sleep(0.15 + rng.random() * 0.5)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        kills += p.exitcode == -signal.SIGKILL
        if path.exists():
            doc = json.loads(path.read_text())  # never torn: the old or the new file
            assert doc["schema"] == 2 and len(doc["entries"]) >= 1500
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                lf, rep = db.load_file(path, "user", "sm90", "gemm", "sm90_f16_wgmma", None)
            assert lf is not None and rep.problems == []
    assert kills == 12
    assert path.exists()
    # the lock is not left held by a dead writer: a new write goes through at once
    db.publish("gemm", {"gemm|op=gemm|dt=half|N=16|K=16": {"regions": [[8, IDS[1]]]}}, tier=tmp_path,
               arch="sm90", lock_timeout=5)
    assert "gemm|op=gemm|dt=half|N=16|K=16" in json.loads(path.read_text())["entries"]


def test_publish_waits_for_the_lock(tmp_path):
    from filelock import FileLock

    db.publish("gemm", {"gemm|op=gemm|dt=half|N=8|K=8": {"regions": [[8, IDS[0]]]}}, tier=tmp_path, arch="sm90")
    lock = FileLock(str(tmp_path / "sm90" / "gemm.json") + ".lock", timeout=0.5)
    with lock:
        with pytest.raises(TimeoutError):
            db.publish("gemm", {"gemm|op=gemm|dt=half|N=8|K=16": {"regions": [[8, IDS[0]]]}}, tier=tmp_path,
                       arch="sm90", lock_timeout=0.2)
