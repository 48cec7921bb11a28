"""`oasr tune matrix` on the command line: validate (UsageError before anything is created or started), plan,
then run on a local Dask cluster (`--local-gpus N --local-cpus M`) or a scheduler (`--scheduler ADDR`)."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ...errors import UsageError
from ..build_cli import float_at_least, int_at_least
from ..candidates import tunable_families
from ..prune import TOP_K

log = logging.getLogger("oasr_ops.tune.matrix")


def _archs(values: list[str]) -> list[str]:
    from ...runtime.arch import normalize_arch

    out: list[str] = []
    for v in values:
        for a in v.replace(";", ",").replace(" ", ",").split(","):
            if a.strip():
                try:
                    out.append(normalize_arch(a))
                except ValueError as e:
                    raise UsageError(f"--arch: {e}") from None
    return list(dict.fromkeys(out))


def _run(args: argparse.Namespace) -> int:
    from ..census_file import check_census
    from .plan import MatrixOptions, check_run_id, make_plan, new_run_id, record_run

    if not args.census:
        raise UsageError("--census is required")
    for c in args.census:
        check_census(c)
    if not args.dry_run and (args.scheduler is None) == (args.local_gpus is None and args.local_cpus is None):
        raise UsageError("give --scheduler ADDR or --local-gpus N [--local-cpus M] (or --dry-run)")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out}: not a directory")
    gpu_archs: list[str] = []
    if args.local_gpus:
        if args.local_archs:
            gpu_archs = _archs([args.local_archs])
            if len(gpu_archs) == 1:
                gpu_archs *= args.local_gpus
            if len(gpu_archs) != args.local_gpus:
                raise UsageError("--local-archs: one arch, or one per --local-gpus")
        elif not args.dry_run:
            from .cluster import local_gpu_archs

            gpu_archs = local_gpu_archs(args.local_gpus)
    archs = _archs(args.arch) or list(dict.fromkeys(gpu_archs))
    if not archs:
        raise UsageError("--arch is required (e.g. --arch sm90,sm80) unless --local-gpus names them")
    mo = MatrixOptions(census=list(args.census), archs=archs, families=args.family or None, out=args.out,
                       run_id=check_run_id(args.run_id) if args.run_id else new_run_id(), thin=args.thin,
                       max_points=args.max_points, max_fill=args.max_fill, rounds=args.rounds,
                       min_speedup=args.min_speedup, max_loss=args.max_loss, prune=not args.no_prune,
                       top_k=args.top_k, validate=not args.no_validate, jobs=args.jobs, measurer=args.measurer)
    plan = make_plan(mo)
    if args.dry_run:
        if args.run_id:
            record_run(mo, write=False)
        print(json.dumps(plan.summary(built=True), indent=1))
        return 0
    if not any(ap.lanes for ap in plan.archs):
        raise UsageError(f"nothing to build: no family of {', '.join(args.census)} has a native lane on "
                         f"{', '.join(archs)}")
    resumed = record_run(mo)
    log.info("run %s%s (resume with --run-id %s)", mo.run_id, " resumed" if resumed else "", mo.run_id)
    return _execute(args, mo, plan, gpu_archs)


def _execute(args: argparse.Namespace, mo, plan, gpu_archs: list[str]) -> int:
    from . import cluster as cl
    from .driver import run_matrix

    local = None
    if args.scheduler is None:
        local = cl.start_local_cluster(gpu_archs, args.local_cpus if args.local_cpus is not None else 1)
    client = cl.connect(local if local is not None else args.scheduler)
    try:
        summary = run_matrix(client, plan, wait_workers_s=args.wait_workers)
        print(json.dumps(summary, indent=1), flush=True)  # before the (slow) shut-down
    finally:
        client.close()
        if local is not None:
            local.close()
    return 0 if summary["ok"] else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("matrix", help="build tuning files for several archs on a Dask cluster",
                       description="Compile every JIT module the builds load on CPU workers, measure each "
                                   "signature on a GPU worker of its arch as soon as that arch's compile lands "
                                   "(oasr tune build's protocol), checkpoint every finished signature, publish "
                                   "<out>/sm<arch>/<family>.json with its measurement log and compile/run "
                                   "reports. Promote a file into db/ by review (`oasr tune diff`), never "
                                   "automatically. See docs/tuning.md.")
    p.add_argument("--census", action="append", default=[], help="census JSON (repeatable)")
    p.add_argument("--arch", action="append", default=[],
                   help="arch families to build, e.g. sm90,sm80 (repeatable; default: the --local-gpus' archs)")
    p.add_argument("--family", action="append", choices=tunable_families(),
                   help="kernel family (repeatable; default: every family with signatures in the census)")
    p.add_argument("--out", type=Path, default=Path(".artifacts/tune_matrix"),
                   help="results and run state (a directory every worker sees)")
    p.add_argument("--run-id", help="resume this run (measure only the signatures it has not checkpointed), or "
                                    "start one of this name (default: a new id, printed)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; start nothing, compile nothing")
    p.add_argument("--scheduler", help="a Dask scheduler address (workers advertise GPU=1,sm<arch>=1 or compile=1)")
    p.add_argument("--local-gpus", type=int_at_least(0), help="start a local cluster with this many GPU workers")
    p.add_argument("--local-cpus", type=int_at_least(0), help="compile workers of the local cluster (default: 1)")
    p.add_argument("--local-archs", help=argparse.SUPPRESS)  # arch of the local GPU workers without a GPU (tests)
    p.add_argument("--measurer", help=argparse.SUPPRESS)  # module:function replacing the GPU measurement (tests)
    p.add_argument("--jobs", type=int_at_least(1), help="nvcc processes per compile task (default: the worker's CPUs, "
                                                  "capped by free memory)")
    p.add_argument("--wait-workers", type=float, default=60.0,
                   help="seconds to wait for workers advertising the resources the run needs")
    p.add_argument("--thin", action=argparse.BooleanOptionalAction, default=True,
                   help="cap census points per signature at --max-points")
    p.add_argument("--max-points", type=int_at_least(2), default=16, help="with --thin: census points per signature")
    p.add_argument("--max-fill", type=int_at_least(0), default=8, help="ladder fill points per signature")
    p.add_argument("--rounds", type=int_at_least(1), default=5, help="interleaved measuring rounds per point")
    p.add_argument("--min-speedup", type=float_at_least(1.0), default=1.05, help="as oasr tune build's")
    p.add_argument("--max-loss", type=float_at_least(0.0), default=0.02, help="as oasr tune build's")
    p.add_argument("--no-prune", action="store_true", help="measure every arm at every point")
    p.add_argument("--top-k", type=int_at_least(1), default=TOP_K, help="configs the cost model keeps per point")
    p.add_argument("--no-validate", action="store_true", help="do not measure the validation midpoints")
    p.set_defaults(func=_run)
