"""The bodies of `oasr tune matrix`'s tasks: plain functions (no Dask import) that Dask runs on its workers and
tests call directly. Every result is a small JSON-able dict.

A measure task writes its signature's log under a temporary name, renames it when the signature is finished,
then writes the checkpoint atomically (build.write_checkpoint): a worker killed mid-signature leaves no
checkpoint and at most a partial ``.part`` log, which the re-run overwrites, so the signature is measured again
from the start and nothing is counted twice. A task that finds its checkpoint (a re-run after the worker wrote it
but died before reporting) returns it without measuring.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ..build import BuildOptions, BuildResult, SignatureWork, checkpoint_path, plan_signature, read_checkpoint, \
    write_checkpoint

# fn(work, points, opts, result, log_fh, arch, lane_name) -> the signature's DB entry (build.measure_signature's
# contract); `--measurer module:function` swaps in another (a test double of the GPU measurement)
Measurer = Callable[..., dict[str, Any]]


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def compile_modules(arch: str, lane: str, modules: list[Any], jobs: int | None = None) -> dict[str, Any]:
    """Compile one (arch, lane)'s modules into this worker's JIT cache with the prebuild job budget
    (codegen.jit.build_many). A module that fails is reported by name; nothing is raised, so the measure tasks
    of other archs (and the other modules of this one) go on."""
    from ...codegen.jit import build_many

    t0 = time.time()
    out: dict[str, Any] = {"arch": arch, "lane": lane, "modules": len(modules), "worker": worker_id(),
                           "jit_dir": os.environ.get("OASR_JIT_DIR")}
    try:
        report = build_many([m.spec() for m in modules], jobs=jobs, progress=False)
        out.update(built=report.built, reused=report.reused, failed=report.failed)
    except Exception as e:  # noqa: BLE001 - a broken toolchain is this task's report, not the run's end
        out.update(built=[], reused=[], failed={m.name: f"{type(e).__name__}: {e}" for m in modules})
    out["wall_s"] = round(time.time() - t0, 3)
    return out


@functools.lru_cache(maxsize=None)
def _host_costs(family: str, arch: str) -> tuple[tuple[str, float], ...]:
    from ..candidates import host_costs

    return tuple(sorted(host_costs(family, arch, "cuda").items()))


def gpu_measurer(work: SignatureWork, points: list, opts: BuildOptions, result: BuildResult, log_fh: Any,
                 arch: str, lane_name: str) -> dict[str, Any]:
    """`oasr tune build`'s measurement of one signature (build.measure_signature) on this worker's GPU."""
    from .. import bench
    from ..build import measure_signature
    from ..candidates import candidates_for, parts_of

    bench.refuse_in_capture()
    cands = candidates_for(parts_of(work.signature), arch)
    return measure_signature(work, points, opts, cands, lane_name, dict(_host_costs(opts.family, arch)), log_fh,
                             result, arch)


def resolve_measurer(name: str | None) -> Measurer:
    if not name:
        return gpu_measurer
    mod, _, fn = name.partition(":")
    return getattr(importlib.import_module(mod), fn)


def warm_worker(families: list[str], arch: str) -> dict[str, Any]:
    """Before the measure stage: CUDA initialised and the host-cost probes taken on this worker, so the first
    signature's time is its own. Checks the worker's GPU is the arch it advertises."""
    from ...runtime.arch import current_arch_family

    t0 = time.time()
    here = current_arch_family()
    if here != arch:
        raise RuntimeError(f"worker {worker_id()} advertises {arch} but its GPU is {here}")
    for fam in families:
        _host_costs(fam, arch)
    return {"worker": worker_id(), "arch": here, "warm_s": round(time.time() - t0, 3)}


def measure_task(task: Any, opts: BuildOptions, log_dir: str, measurer: str | None = None,
                 compiled: Any = None) -> dict[str, Any]:
    """Measure one signature (`task`: a plan.MeasureTask) with `opts` (its checkpoint_dir is the run's), write
    its log and checkpoint. `compiled`: the arch's compile reports (only a dependency: Dask starts this task
    once they are in)."""
    from ...runtime.arch import current_arch_family

    sig, arch = task.signature, task.arch
    ckpt_dir = Path(opts.checkpoint_dir)
    base = {"signature": sig, "arch": arch, "family": task.family, "worker": worker_id()}
    if read_checkpoint(ckpt_dir, sig) is not None:
        return {**base, "resumed": True}
    if measurer is None and current_arch_family() != arch:
        raise RuntimeError(f"worker {worker_id()} serves {current_arch_family()}, the task needs {arch} "
                           "(a worker advertises its own arch family as a resource)")
    # modules the compile stage should have left in the JIT cache; the ones missing are compiled by the GPU
    missing = [m.name for m in task.modules if not m.spec().is_built()] if measurer is None else []
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / checkpoint_path(ckpt_dir, sig).with_suffix(".jsonl").name
    part = log_path.with_name(f".{log_path.name}.{os.getpid()}.part")
    result = BuildResult()
    points = plan_signature(task.work, opts)
    t0 = time.time()
    with open(part, "w", encoding="utf-8") as fh:
        entry = resolve_measurer(measurer)(task.work, points, replace(opts, log=None), result, fh, arch, task.lane)
    t1 = time.time()
    os.replace(part, log_path)
    stats = {"points_measured": result.points_measured, "arms_measured": result.arms_measured,
             "arms_pruned": result.arms_pruned, "validation_points": result.validation_points,
             "validation_splits": result.validation_splits, "rejected": result.rejected,
             "had_to_compile": missing, "t_start": t0, "t_end": t1, "measure_s": round(t1 - t0, 3)}
    write_checkpoint(ckpt_dir, sig, entry, stats={**stats, "worker": base["worker"]})
    return {**base, "resumed": False, **stats}


def publish_pair(arch: str, family: str, lane: str, signatures: list[str], opts: BuildOptions, log_dir: str,
                 out: str) -> dict[str, Any]:
    """The partition/publish step of one (arch, family): every signature's checkpointed entry into the tuning
    file ``<out>/<arch>/<family>.json`` (database.publish, fresh), the signatures' logs concatenated into the
    measurement log, the cost model fitted on it (as `oasr tune build` fits on its log), stamped with the
    validators the measurements were taken under. Nothing is written while a signature is missing."""
    from .. import database
    from ..from_log import model_from_log

    ckpt_dir = Path(opts.checkpoint_dir)
    entries = {s: read_checkpoint(ckpt_dir, s) for s in signatures}
    missing = sorted(s for s, e in entries.items() if e is None)
    res: dict[str, Any] = {"arch": arch, "family": family, "signatures": len(signatures), "missing": missing}
    if missing:
        return {**res, "written": None}
    dest = Path(out) / arch
    dest.mkdir(parents=True, exist_ok=True)
    log_path = dest / f"{family}_measurements.jsonl"
    tmp = log_path.with_name(f".{log_path.name}.{os.getpid()}.tmp")
    stamp = None
    records = 0
    with open(tmp, "w", encoding="utf-8") as fh:
        for s in signatures:
            part = Path(log_dir) / checkpoint_path(ckpt_dir, s).with_suffix(".jsonl").name
            if not part.is_file():
                continue  # a checkpoint without its log: a run of an older layout; the entry still stands
            for line in part.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    fh.write(line + "\n")
                    records += 1
                    if stamp is None:
                        stamp = json.loads(line).get("validators")
    os.replace(tmp, log_path)
    model = model_from_log(log_path, family, arch) if records else None
    path = database.publish(family, entries, tier=out, arch=arch, lane=lane, fresh=True, model=model, stamp=stamp)
    return {**res, "written": str(path), "log": str(log_path), "records": records, "model": model is not None}

