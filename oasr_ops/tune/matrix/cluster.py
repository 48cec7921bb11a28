"""The Dask side of `oasr tune matrix`: a local cluster or a scheduler address, and what the workers advertise.

Resources (Dask's worker resources; a task runs only on a worker that has what it asks for):
  GPU=1, sm<arch>=1   a measuring worker: one GPU (CUDA_VISIBLE_DEVICES), one thread, its arch family;
  compile=1           a compile worker: runs nvcc (a compile task takes the prebuild job budget of its machine).
On a cluster of your own start the workers so, e.g. per GPU of an H200 host:

  CUDA_VISIBLE_DEVICES=0 dask worker tcp://SCHEDULER:8786 --nthreads 1 --resources "GPU=1,sm90=1"
  dask worker tcp://SCHEDULER:8786 --nthreads 1 --resources "compile=1"

with the same checkout, OASR_JIT_DIR and ``--out`` directory on a filesystem every worker shares. Dask is
imported here only.
"""
from __future__ import annotations

import os
import time
from typing import Any

from ...errors import UsageError

GPU = "GPU"
COMPILE = "compile"


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise UsageError("oasr tune matrix runs on Dask distributed: pip install distributed") from None
    return distributed


def local_gpu_archs(n: int) -> list[str]:
    """The arch family of each of this machine's first `n` GPUs."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("--local-gpus: no CUDA GPU on this machine")
    if n > torch.cuda.device_count():
        raise UsageError(f"--local-gpus {n}: this machine has {torch.cuda.device_count()} GPU(s)")
    return ["sm%d%d" % torch.cuda.get_device_capability(i) for i in range(n)]


def start_local_cluster(gpu_archs: list[str], cpus: int, devices: list[str] | None = None) -> Any:
    """A Dask cluster on this machine: one single-thread worker process per GPU (its own CUDA_VISIBLE_DEVICES,
    resources GPU=1 and its arch family) and `cpus` compile workers. Each worker runs under a nanny, which
    restarts it when it dies; the scheduler hands the dead worker's task to another. `devices`: the
    CUDA_VISIBLE_DEVICES of each GPU worker (default 0, 1, ...)."""
    d = _distributed()
    devices = devices or [str(i) for i in range(len(gpu_archs))]
    # no memory limit: a worker holding torch and a GPU's operands must not be paused or restarted by Dask
    common = {"nthreads": 1, "memory_limit": 0}
    workers: dict[str, Any] = {}
    for i, (dev, arch) in enumerate(zip(devices, gpu_archs)):
        workers[f"gpu{i}"] = {"cls": d.Nanny, "options": {
            **common, "name": f"gpu{i}-{arch}", "resources": {GPU: 1, arch: 1},
            "env": {"CUDA_VISIBLE_DEVICES": dev}}}
    for j in range(cpus):
        workers[f"cpu{j}"] = {"cls": d.Nanny, "options": {**common, "name": f"cpu{j}", "resources": {COMPILE: 1},
                                                          "env": {"CUDA_VISIBLE_DEVICES": ""}}}
    scheduler = {"cls": d.Scheduler, "options": {"dashboard_address": None}}
    return d.SpecCluster(workers=workers, scheduler=scheduler, name="oasr-tune-matrix", silence_logs=40)


def connect(address_or_cluster: Any) -> Any:
    return _distributed().Client(address_or_cluster, set_as_default=False)


def workers_by_resource(client: Any) -> dict[str, list[str]]:
    """{resource name: worker addresses advertising it}."""
    out: dict[str, list[str]] = {}
    try:
        info = client.scheduler_info(n_workers=-1)  # every worker (newer distributed lists 5 by default)
    except TypeError:
        info = client.scheduler_info()
    for addr, w in info["workers"].items():
        for r, v in (w.get("resources") or {}).items():
            if v:
                out.setdefault(r, []).append(addr)
    return out


def wait_for_resources(client: Any, needed: list[str], timeout_s: float) -> dict[str, list[str]]:
    """Wait until a worker advertises each of `needed` or `timeout_s` passes; returns what is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        have = workers_by_resource(client)
        if all(r in have for r in needed) or time.monotonic() >= deadline:
            return have
        time.sleep(0.5)


def worker_pids(client: Any) -> dict[str, int]:
    """{worker address: its process id} (the fault-injection of the tests and benchmarks/matrix_run.py)."""
    return client.run(os.getpid)
