"""`oasr tune prebuild`: compile kernels for `OASR_CUDA_ARCH_LIST` without a GPU.

Default set: the production compile set of every gemm lane that runs on the target arch (DB references + lane
default + coverage basis) and of the native int8 scaled_mm lane (the same, plus every tile the heuristic
answers; fp16/bf16 output kernels and, for data-parallel tiles, the quantizing variant) and of the native bmm
lane (lane default, coverage basis and DB references, both B layouts); `--all` the whole spaces; `--configs ID
...` exactly those gemm configs. `--family gemm|scaled_mm|bmm` narrows to one family.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..families.gemm.kernels import DTYPES, lanes_for, production_configs, specs_for
from ..codegen.jit import JitSpec, build_many, nvcc_path
from ..configs import ConfigError, parse
from ..runtime.arch import normalize_arch


def plan_specs(arch: str, configs: list[str] | None, all_: bool, dtypes: tuple[str, ...],
               family: str | None = None) -> list[JitSpec]:
    specs: list[JitSpec] = []
    lanes = lanes_for(arch)
    if not lanes:
        raise SystemExit(f"oasr tune prebuild: no GEMM lane runs on {arch}")
    if configs:
        for cid in configs:
            cfg = parse(cid)
            lane = next((l for l in lanes if cfg in l.space), None)
            if lane is None:
                raise SystemExit(f"oasr tune prebuild: {cid} is in no lane that runs on {arch}")
            specs += specs_for(lane, [cfg], dtypes, arch)
        return specs
    if family in (None, "gemm"):
        for lane in lanes:
            chosen = list(lane.space) if all_ else production_configs(lane, arch)
            specs += specs_for(lane, chosen, dtypes, arch)
    if family in (None, "scaled_mm"):
        specs += _scaled_mm_specs(arch, all_, dtypes)
    if family in (None, "bmm"):
        specs += _bmm_specs(arch, all_, dtypes)
    # The heaviest (3.x) compiles first so the pool's tail is short ones.
    return sorted(specs, key=lambda s: -s.est_memory)


def _scaled_mm_specs(arch: str, all_: bool, dtypes: tuple[str, ...]) -> list[JitSpec]:
    import importlib

    from ..runtime.registry import native_lane

    smm = importlib.import_module("oasr_ops.families.scaled_mm.ops")
    lane = native_lane(arch, "scaled_mm")
    if lane is None:
        return []
    chosen = list(lane.space) if all_ else smm.production_configs(arch)
    specs = [JitSpec.for_kernel(lane, c, dt, arch) for c in chosen for dt in dtypes]
    # the quantizing launcher (int8 output) exists for data-parallel tiles only
    specs += [JitSpec.for_kernel(lane, c, "int8", arch) for c in chosen if c.kernel_schedule != "streamk"]
    return specs


def _bmm_specs(arch: str, all_: bool, dtypes: tuple[str, ...]) -> list[JitSpec]:
    from ..runtime.registry import native_lane
    from ..families.bmm.lanes import B_MAJORS, kernel_variant

    lane = native_lane(arch, "bmm")
    if lane is None:
        return []
    chosen = list(lane.space) if all_ else production_configs(lane, arch)
    return [JitSpec.for_kernel(lane, c, kernel_variant(dt, mj), arch) for c in chosen for dt in dtypes
            for mj in B_MAJORS]


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
    p.add_argument("--family", choices=["gemm", "scaled_mm", "bmm"], help="one kernel family only (default: all)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (capped by free memory)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
