"""`oasr tune build` on the command line: argument parsing and validation of everything the run reads or
writes (a `UsageError` before any directory or file is created, see `oasr_ops.errors`); the measuring itself is
`oasr_ops.tune.build`."""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..runtime import registry
from .build import BuildOptions, build, default_family, entries_from_log, load_works, model_from_log
from .candidates import tunable_families
from .census_file import check_census
from .prune import TOP_K

log = logging.getLogger("oasr_ops.tune.build")

def _check_log(path: str, family: str) -> None:
    """UsageError unless `path` is a measurement log of `family`: JSON lines, each an object with signature, m,
    config and median_s (what `entries_from_log` reads) whose values `evaluate.record_problem` accepts and whose
    signature is a tuning signature, at least one of `family`. Records of another family are left out (a DB
    file holds one family; `entries_from_log(family=...)`), with one warning."""
    from ..errors import UsageError, existing_file, json_lines
    from ..runtime.database import parse_signature
    from .evaluate import record_problem

    existing_file(path, "--from-log")
    n, others = 0, {}
    try:
        for i, r in json_lines(path):
            why = record_problem(r)
            if why is None and not all(k in r for k in ("signature", "m", "config", "median_s")):
                why = "lacks one of signature, m, config, median_s"
            elif why is None and not (isinstance(r["median_s"], (int, float)) and r["median_s"] >= 0):
                why = f"median_s must be a number >= 0, got {json.dumps(r['median_s'])}"  # the partition's times
            if why is not None:
                raise UsageError(f"--from-log {path}:{i}: not a measurement record (JSON with signature, m, "
                                 f"config, median_s): {why}")
            parts = parse_signature(r["signature"])
            if parts is None:
                raise UsageError(f"--from-log {path}:{i}: signature {r['signature'][:80]!r} is not a tuning "
                                 "signature")
            if parts.family == family:
                n += 1
            else:
                others[parts.family] = others.get(parts.family, 0) + 1
    except UsageError:
        raise
    except ValueError as e:  # json_lines: a line that is not JSON, bytes that are not UTF-8 (naming the line)
        raise UsageError(f"--from-log {e}") from None
    held = ", ".join(f"{c} {fam}" for fam, c in sorted(others.items()))
    if n == 0:
        raise UsageError(f"--from-log {path}: no measurement records of the {family} family"
                         + (f" (it holds {held}: see --family)" if held else ""))
    if others:
        log.warning("--from-log %s: %s record(s) of other families left out (--family %s)", path, held, family)


def check_tier_dir(out: str, arch: str | None, opt: str = "--out", write: bool = True) -> None:
    """UsageError unless the tier `out` names (user | system | a directory) can hold `<arch>/<family>.json`: a
    path component that exists as a regular file (OASR_TUNE_USER_DB pointing at one, a typo'd --out), or with
    `write` a nearest existing directory this user cannot write (a read-only install's system tier), would be an
    OSError from the writer after the work is done. `opt`: the option that named the tier."""
    from ..errors import UsageError
    from ..paths import system_db_dir, user_db_dir

    if not out:
        raise UsageError(f"{opt}: empty (user | system | a directory)")
    root = user_db_dir() if out == "user" else system_db_dir() if out == "system" else Path(out).expanduser()
    if root is None:
        raise UsageError(f"{opt} user: the user tier is disabled (OASR_TUNE_USER_DB=off)")
    what = {"user": f"{opt} user (OASR_TUNE_USER_DB)", "system": f"{opt} system"}.get(out, f"{opt} {out}")
    p = root / arch if arch else root
    while not p.exists() and p != p.parent:  # the nearest existing ancestor decides
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"{what}: {p} is not a directory")
    if write and not os.access(p, os.W_OK | os.X_OK):  # the lock file and the atomic rename write there
        raise UsageError(f"{what}: {p} is not writable by this user")


def _arch_for_cli(arch: str | None) -> str:
    from ..errors import UsageError
    from ..runtime.arch import require_arch

    try:
        return require_arch(arch)
    except RuntimeError:
        raise UsageError("no GPU here to take the arch family from: pass --arch (e.g. sm90)") from None
    except ValueError as e:
        raise UsageError(f"--arch {arch}: {e}") from None


def _run(args: argparse.Namespace) -> int:
    """`oasr tune build`. Everything is validated (UsageError) before a directory or file is created."""
    from ..errors import UsageError, json_file
    from ..paths import cache_root
    from ..runtime.arch import current_arch_family

    if args.from_log and args.census:
        raise UsageError("--census and --from-log exclude each other")
    if args.stamp_from and not args.from_log:
        raise UsageError("--stamp-from needs --from-log")
    if not args.census and not args.from_log:
        raise UsageError("--census is required (or --from-log)")
    if args.out not in ("user", "system") and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: not a directory (user | system | a directory)")
    check_tier_dir(args.out, None)
    try:
        arch = args.arch or current_arch_family() or "unknown"
    except ValueError as e:  # a misspelt OASR_ARCH (a bad --arch is named by _arch_for_cli)
        raise UsageError(f"OASR_ARCH: {e}") from None
    run_dir = cache_root() / "tune" / "v2" / "measurements"
    opts = BuildOptions(
        out=args.out, family=args.family, fresh=args.fresh, thin=args.thin, max_points=args.max_points,
        max_fill=args.max_fill, min_speedup=args.min_speedup, max_loss=args.max_loss, rounds=args.rounds,
        arch=args.arch, prune=not args.no_prune, top_k=args.top_k, validate=not args.no_validate,
        log=Path(args.log) if args.log else run_dir / f"{arch}.jsonl",
        checkpoint_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else run_dir / f"{arch}-checkpoints",
    )
    if args.from_log:
        from . import database
        from ..runtime.registry import native_lane

        _check_log(args.from_log, args.family)
        stamp_doc = json_file(args.stamp_from, "--stamp-from") if args.stamp_from else None
        if stamp_doc is not None and not (isinstance(stamp_doc, dict) and isinstance(stamp_doc.get("validators"),
                                                                                     dict)):
            raise UsageError(f"--stamp-from {args.stamp_from}: not a tuning DB file (no 'validators')")
        a = _arch_for_cli(args.arch)
        check_tier_dir(args.out, a)
        lane = native_lane(a, args.family)
        if lane is None:  # as the measuring build: a file no lane of the arch serves would be written and ignored
            raise UsageError(f"no {args.family} lane is native to {a}")
        # partitioned for the arch it is published for (its lane's candidates and fallback), of --family only
        try:
            entries, stamp = entries_from_log(args.from_log, replace(opts, arch=a), family=args.family)
        except ValueError as e:  # a log this code cannot partition (one measured under an older lane default)
            raise UsageError(f"--from-log {args.from_log}: cannot partition it for {a}: {e}") from None
        if stamp_doc is not None:  # a log written before logs carried validators: the GPU-written file's stamp
            stamp = stamp_doc["validators"]
        if stamp is None:
            log.warning("the log records no validators; stamping with this machine's (pass --stamp-from a DB "
                        "file written by the measuring run)")
        model = model_from_log(args.from_log, args.family, a)
        path = database.publish(args.family, entries, tier=args.out, arch=a, lane=lane.name if lane else None,
                                fresh=args.fresh, stamp=stamp, model=model)
        print(json.dumps({"signatures": len(entries), "from_log": args.from_log, "stamp": stamp,
                          "model": model is not None, "written": str(path)}))
        return 0
    for c in args.census:
        check_census(c)
    if args.family != default_family():
        # every other family keeps its own default log and checkpoints beside the default family's
        if not args.log:
            opts.log = opts.log.with_name(opts.log.stem + f"-{args.family}.jsonl")
        if not args.checkpoint_dir:
            opts.checkpoint_dir = opts.checkpoint_dir.with_name(opts.checkpoint_dir.name + f"-{args.family}")
    if opts.log.exists() and not opts.log.is_file():
        raise UsageError(f"--log {opts.log}: not a regular file")
    if not load_works(args.census, args.family):
        raise UsageError(f"no {args.family} signatures in {', '.join(args.census)} (see --family)")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("measuring needs a CUDA GPU and none is available here (--from-log re-partitions a "
                         "finished log without one)")
    a = _arch_for_cli(args.arch)
    check_tier_dir(args.out, a)
    if registry.native_lane(a, args.family) is None:
        raise UsageError(f"no {args.family} lane is native to {a}")
    opts.log.parent.mkdir(parents=True, exist_ok=True)  # validated: now the run may create its directories
    res = build(args.census, opts)
    print(json.dumps({"signatures": len(res.entries), "resumed": len(res.resumed),
                      "points_measured": res.points_measured, "arms_measured": res.arms_measured,
                      "measure_s": round(res.measure_s, 1), "wall_s": round(res.wall_s, 1),
                      "rejected_by_numeric_gate": res.rejected, "log": str(opts.log),
                      "arms_pruned": res.arms_pruned, "validation_points": res.validation_points,
                      "validation_splits": res.validation_splits, "model": res.model}, indent=1))
    return 0


def int_at_least(minimum: int) -> Any:
    """argparse type: an integer >= `minimum` (the tuning commands' counts)."""
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        return v
    conv.__name__ = "integer"
    return conv


def float_at_least(minimum: float) -> Any:
    """argparse type: a finite number >= `minimum` (the partition's thresholds: NaN compares false everywhere and
    would pass every region, infinity none)."""
    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(v) and v >= minimum):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= {minimum:g}")
        return v
    conv.__name__ = "number"
    return conv


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="measure census points on this GPU and write tuning entries",
                       description="Measure every census point's candidate kernels on this GPU, partition M into "
                                   "regions and write the tuning DB (see docs/tuning.md). --from-log redoes the "
                                   "partition of a finished build's log without a GPU.")
    p.add_argument("--census", action="append", default=[],
                   help="census JSON from `oasr tune census` (repeatable; required unless --from-log)")
    p.add_argument("--from-log", help="partition a finished build's measurement log again (no GPU) and write it")
    p.add_argument("--stamp-from", help="with --from-log: stamp the file with this DB file's validators (the "
                                        "measuring run's), for logs that do not record them")
    p.add_argument("--out", default="user", help="where to write: user | system | a directory")
    p.add_argument("--family", default=default_family(), choices=tunable_families(), help="kernel family to tune")
    p.add_argument("--fresh", action="store_true", help="replace the tier's file instead of merging")
    p.add_argument("--thin", action="store_true", help="cap census points per signature (--max-points)")
    # --max-points >= 2: the planner keeps the smallest and the largest census M of a signature
    p.add_argument("--max-points", type=int_at_least(2), default=16, help="with --thin: census points per signature")
    p.add_argument("--max-fill", type=int_at_least(0), default=8, help="ladder fill points per signature")
    p.add_argument("--min-speedup", type=float_at_least(1.0), default=1.05,
                   help="a region config must beat the fallback by this factor (>= 1) over its region")
    p.add_argument("--max-loss", type=float_at_least(0.0), default=0.02,
                   help="a region config may lose to the fallback by at most this fraction (>= 0) at any point")
    p.add_argument("--rounds", type=int_at_least(1), default=5, help="interleaved measuring rounds per point")
    p.add_argument("--no-prune", action="store_true",
                   help="measure every arm at every point (default: the cost model's --top-k + the forced set)")
    p.add_argument("--top-k", type=int_at_least(1), default=TOP_K, help="configs the cost model keeps per point")
    p.add_argument("--no-validate", action="store_true",
                   help="do not measure the geometric midpoints between measured Ms to check the regions there")
    p.add_argument("--arch", help="arch family, e.g. sm90 (default: this GPU's)")
    p.add_argument("--log", help="measurement log JSONL (default: ~/.cache/oasr/tune/v2/measurements/<arch>.jsonl)")
    p.add_argument("--checkpoint-dir", help="per-signature checkpoints, for resuming (default: beside the log)")
    p.set_defaults(func=_run)
