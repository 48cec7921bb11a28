"""`oasr tune prebuild`: compile kernels for `OASR_CUDA_ARCH_LIST` without a GPU.

Every registered family that supplies ``handlers["prebuild_specs"]`` (fn(arch, all_, dtypes, configs=None) ->
JitSpecs) contributes its set: by default its production compile set (gemm: DB references + lane default +
coverage basis of every lane on the arch; int8 scaled_mm: the same plus every heuristic tile, with the quantizing
variant; bmm: both B layouts), with `--all` its whole spaces, with `--configs ID ...` exactly those configs (each
built by the first family, in registration order, with a lane on the arch that holds it). `--family` narrows to
one family; its choices are the registry's.
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import families as _families  # noqa: F401  (fills the registry)
from ..codegen.jit import JitSpec, build_many, nvcc_path
from ..configs import ConfigError, parse
from ..runtime import registry
from ..runtime.arch import normalize_arch

DTYPES = ("fp16", "bf16")  # the half-precision output dtypes a prebuild compiles by default


def prebuild_families() -> list[str]:
    """Families with a prebuild set, in registration order (the `--family` choices)."""
    return [name for name, spec in registry.families().items() if spec.handler("prebuild_specs") is not None]


def plan_specs(arch: str, configs: list[str] | None, all_: bool, dtypes: tuple[str, ...],
               family: str | None = None) -> list[JitSpec]:
    names = prebuild_families()
    if not any(registry.lanes_for(arch, f) for f in names):
        raise SystemExit(f"oasr tune prebuild: no GEMM lane runs on {arch}")
    specs: list[JitSpec] = []
    if configs:
        for cid in configs:
            cfg = parse(cid)
            owner = next((f for f in names if any(cfg in lane.space for lane in registry.lanes_for(arch, f))), None)
            if owner is None:
                raise SystemExit(f"oasr tune prebuild: {cid} is in no lane that runs on {arch}")
            specs += registry.get(owner).handler("prebuild_specs")(arch, False, dtypes, configs=[cfg])
        return specs
    for name in names:
        if family in (None, name):
            specs += registry.get(name).handler("prebuild_specs")(arch, all_, dtypes)
    # The heaviest (3.x) compiles first so the pool's tail is short ones.
    return sorted(specs, key=lambda s: -s.est_memory)


def _run(args: argparse.Namespace) -> int:
    if nvcc_path() is None:
        print("oasr tune prebuild: nvcc not found", file=sys.stderr)
        return 2
    archs = (args.arch or os.environ.get("OASR_CUDA_ARCH_LIST", "")).replace(";", " ").replace(",", " ").split()
    if not archs:
        print("oasr tune prebuild: set OASR_CUDA_ARCH_LIST (e.g. 9.0a) or pass --arch", file=sys.stderr)
        return 2
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else DTYPES
    specs: list[JitSpec] = []
    try:
        for a in archs:
            specs += plan_specs(normalize_arch(a), args.configs, args.all, dtypes, args.family)
    except (ConfigError, ValueError) as e:
        print(f"oasr tune prebuild: {e}", file=sys.stderr)
        return 2
    print(f"oasr tune prebuild: {len(specs)} kernel(s) for {', '.join(archs)}", file=sys.stderr)
    report = build_many(specs, jobs=args.jobs, progress=not args.quiet)
    print(report.summary())
    return 1 if report.failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prebuild", help="compile kernels without a GPU (for OASR_CUDA_ARCH_LIST)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--configs", nargs="+", metavar="ID", help="exactly these config ids")
    g.add_argument("--all", action="store_true", help="the whole config space of every lane")
    p.add_argument("--arch", help="override OASR_CUDA_ARCH_LIST (e.g. 9.0a)")
    p.add_argument("--dtypes", help="comma list of fp16,bf16 (default both)")
    p.add_argument("--family", choices=prebuild_families(), help="one kernel family only (default: all)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (capped by free memory)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
