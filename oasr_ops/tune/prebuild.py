"""`oasr tune prebuild`: compile kernels for `OASR_CUDA_ARCH_LIST` without a GPU.

Every registered family that supplies ``handlers["prebuild_specs"]`` (fn(arch, all_, dtypes, configs=None) ->
JitSpecs) contributes its set: by default its production compile set (gemm: DB references + lane default +
coverage basis of every lane on the arch; int8 scaled_mm: the same plus every heuristic tile, with the quantizing
variant; bmm: both B layouts), with `--all` its whole spaces, with `--configs ID ...` exactly those configs (each
built by the first family, in registration order, with a lane on the arch that holds it). `--family` narrows to
one family; its choices are the registry's.

`--census FILE` (spec, "Building on other architectures"): exactly the candidates `oasr tune build --census FILE`
will load there (`census_plan`): per signature the build's points (census, fill, validation; --thin,
--max-points, --max-fill as the build takes them) and at each the arms the cost model keeps (build.arm_plan: its
top-k over the feasible configs + the forced set; --no-prune: all), a pseudo-arm as the tile it resolves to.
Deterministic from the census and the arch's tuning files (the model section pruning ranks with), so a CPU
compile server plans what the GPU build will load. Kernel dtype: the signature's (``dt=half`` is measured in
fp16); each config is compiled in the variants its family builds for that dtype (bmm: both B layouts; int8:
with the quantizing variant).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .. import families as _families  # noqa: F401  (fills the registry)
from ..codegen.jit import JitSpec, build_many, nvcc_path
from ..configs import SENTINELS, ConfigError, parse
from ..errors import UsageError
from ..runtime import registry
from ..runtime.arch import normalize_arch

log = logging.getLogger(__name__)

DTYPES = ("fp16", "bf16")  # the half-precision output dtypes a prebuild compiles by default


def prebuild_families() -> list[str]:
    """Families with a prebuild set, in registration order (the `--family` choices)."""
    return [name for name, spec in registry.families().items() if spec.handler("prebuild_specs") is not None]


def census_plan(census: list[str], arch: str, family: str | None = None, opts: Any = None
                ) -> dict[tuple[str, str], list[str]]:
    """{(family, kernel dtype): sorted config ids} that `oasr tune build --census ...` loads on `arch`, for every
    family with both a candidate factory and a prebuild set (or `family` alone). `opts`: the build's
    BuildOptions (thinning, fill, pruning, validation); default: the build's defaults."""
    from dataclasses import replace

    from .build import BuildOptions, load_works
    from .candidates import tunable_families

    opts = opts or BuildOptions()
    out: dict[tuple[str, str], set[str]] = {}
    for fam in tunable_families():
        if family not in (None, fam) or fam not in prebuild_families():
            continue
        fopts = replace(opts, family=fam)
        for sig, work in load_works(census, fam).items():
            dt, ids = signature_configs(work, fopts, arch)
            for d in (dt, *gate_dtypes(sig)):
                out.setdefault((fam, d), set()).update(ids)
    return {key: sorted(ids) for key, ids in sorted(out.items()) if ids}


def gate_dtypes(sig: str) -> tuple[str, ...]:
    """Kernel dtypes the build's numeric gates also run a signature's candidates in, untimed (the family's
    ``gate_dtypes`` handler; scaled_mm_fp8: fp16 output beside the timed bf16)."""
    from .candidates import parts_of

    parts = parts_of(sig)
    handler = registry.get(parts.family).handler("gate_dtypes")
    return tuple(handler(parts)) if handler else ()


def signature_configs(work: Any, opts: Any, arch: str) -> tuple[str, set[str]]:
    """(kernel dtype, config ids) one signature of `oasr tune build` loads on `arch`: at each planned point the
    arms `build.arm_plan` keeps, a pseudo-arm as the tile it resolves to. `work`: a build.SignatureWork."""
    from dataclasses import replace

    from .build import arm_plan, plan_signature
    from .candidates import candidates_for, parts_of

    sig = work.signature
    parts = parts_of(sig)
    cands = candidates_for(parts, arch)
    by_id = {c.id: c for c in cands}
    points = plan_signature(work, opts)
    plan = arm_plan(sig, points, opts, arch, cands=cands)
    ids: set[str] = set()
    for p in points:
        q = replace(p, signature=sig, family=parts.family, op=parts.op, dtype=parts.dt or "half", n=parts.n,
                    k=parts.k)
        ids.update(c for c in (by_id[cid].config_at(q) for cid in plan[p.m]) if c not in SENTINELS)
    measure_dtype = registry.get(parts.family).handler("measure_dtype")  # the dtype its candidates run in
    return (measure_dtype(parts) if measure_dtype else {"bf16": "bf16"}.get(parts.dt or "", "fp16")), ids


def signature_specs(work: Any, opts: Any, arch: str) -> list[JitSpec]:
    """The JitSpecs of `signature_configs` (the modules measuring that one signature loads)."""
    dt, ids = signature_configs(work, opts, arch)
    fam = work.signature.split("|", 1)[0]
    make = registry.get(fam).handler("prebuild_specs")
    if make is None or not ids:
        return []
    return list(make(arch, False, (dt, *gate_dtypes(work.signature)), configs=[parse(c) for c in sorted(ids)]))


def census_specs(census: list[str], arch: str, family: str | None = None, opts: Any = None) -> list[JitSpec]:
    """The JitSpecs of `census_plan`, deduplicated, heaviest first."""
    specs: dict[str, JitSpec] = {}
    for (fam, dt), ids in census_plan(census, arch, family, opts).items():
        for s in registry.get(fam).handler("prebuild_specs")(arch, False, (dt,), configs=[parse(c) for c in ids]):
            specs.setdefault(s.name, s)
    return sorted(specs.values(), key=lambda s: -s.est_memory)


def plan_specs(arch: str, configs: list[str] | None, all_: bool, dtypes: tuple[str, ...],
               family: str | None = None, census: list[str] | None = None, opts: Any = None) -> list[JitSpec]:
    names = prebuild_families()
    if not any(registry.lanes_for(arch, f) for f in names):
        raise UsageError(f"no GEMM lane runs on {arch}")
    if census:
        return census_specs(census, arch, family, opts)
    specs: list[JitSpec] = []
    if configs:
        for cid in configs:
            cfg = parse(cid)
            owner = next((f for f in names if any(cfg in lane.space for lane in registry.lanes_for(arch, f))), None)
            if owner is None:
                raise UsageError(f"{cid} is in no lane that runs on {arch}")
            specs += registry.get(owner).handler("prebuild_specs")(arch, False, dtypes, configs=[cfg])
        return specs
    for name in names:
        if family in (None, name):
            specs += registry.get(name).handler("prebuild_specs")(arch, all_, dtypes)
    # The heaviest (3.x) compiles first so the pool's tail is short ones.
    return sorted(specs, key=lambda s: -s.est_memory)


def _dtypes(text: str) -> tuple[str, ...]:
    """--dtypes: a comma list of the known half-precision dtypes (never a free string: it names files)."""
    out = tuple(d.strip() for d in text.split(",") if d.strip())
    bad = [d for d in out if d not in DTYPES]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of {', '.join(DTYPES)}")
    return tuple(dict.fromkeys(out))


def _jobs(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def _build_hot_path() -> int:
    """The C++ hot path (families/hot_path.py) for this process's torch, into the JIT cache."""
    from ..codegen.host_ext import BuildError, HostExtension

    try:
        path = HostExtension().build()
    except BuildError as e:
        print(f"C++ hot path: build failed: {e}", file=sys.stderr)
        return 1
    print(f"C++ hot path: {path}")
    return 0


# The options that shape a --census plan, with their defaults: given without --census they would change nothing
# (and a prebuild of the whole production set would start), so that is a usage error.
CENSUS_ONLY = {"thin": False, "max_points": 16, "max_fill": 8, "no_prune": False, "top_k": 16, "no_validate": False}


def _run(args: argparse.Namespace) -> int:
    """`oasr tune prebuild`: arch list, dtypes and configs are validated (UsageError) before nvcc runs."""
    stray = [f"--{k.replace('_', '-')}" for k, d in CENSUS_ONLY.items() if getattr(args, k) != d]
    if stray and not args.census:
        raise UsageError(f"{', '.join(stray)} shape(s) a --census plan: pass --census FILE with it (without "
                         "--census, prebuild builds the production set, --configs or --all)")
    if args.hot_path or args.hot_path_only:
        rc = _build_hot_path()
        if rc or args.hot_path_only:
            return rc
    source = "--arch" if args.arch else "OASR_CUDA_ARCH_LIST"
    archs = (args.arch or os.environ.get("OASR_CUDA_ARCH_LIST", "")).replace(";", " ").replace(",", " ").split()
    if not archs:
        raise UsageError("set OASR_CUDA_ARCH_LIST (e.g. 9.0a) or pass --arch")
    try:  # named here, so a ValueError of the planning below is never called an arch error
        families = [normalize_arch(a) for a in archs]
    except ValueError as e:
        raise UsageError(f"{source}: {e}") from None
    dtypes = args.dtypes or DTYPES
    specs: list[JitSpec] = []
    opts = None
    if args.census:
        from .build import BuildOptions
        from .census_file import check_census

        for c in args.census:
            check_census(c)

        opts = BuildOptions(thin=args.thin, max_points=args.max_points, max_fill=args.max_fill,
                            prune=not args.no_prune, top_k=args.top_k, validate=not args.no_validate)
    try:
        for a in families:
            specs += plan_specs(a, args.configs, args.all, dtypes, args.family, args.census, opts)
    except ConfigError as e:
        raise UsageError(f"--configs: {e}") from None
    except UsageError:
        raise
    except OSError as e:  # an unreadable --census file
        raise UsageError(f"--census: {e}") from None
    except ValueError as e:  # the plan refused something the checks above let through: name that input
        source = f"--census {', '.join(args.census)}" if args.census else "--configs" if args.configs else None
        if source is None:
            raise  # the production set has no user input to blame: a bug keeps its traceback
        raise UsageError(f"{source}: {e}") from None
    if nvcc_path() is None:
        raise UsageError("nvcc not found (install the CUDA toolkit or put nvcc on PATH)")
    log.info("%d kernel(s) for %s", len(specs), ", ".join(archs))
    # no bar with prebuild's --no-progress (formerly --quiet) or the global -q
    report = build_many(specs, jobs=args.jobs, progress=not (args.no_progress or args.quiet))
    print(report.summary())
    return 1 if report.failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    from .build_cli import int_at_least

    p = sub.add_parser("prebuild", help="compile kernels without a GPU (for OASR_CUDA_ARCH_LIST)",
                       description="Compile the production kernel set (or --all, or --configs) for the archs of "
                                   "OASR_CUDA_ARCH_LIST / --arch into the JIT cache; needs nvcc, not a GPU.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--configs", nargs="+", metavar="ID", help="exactly these config ids (default: the production "
                                                              "set)")
    g.add_argument("--all", action="store_true", help="the whole config space of every lane")
    g.add_argument("--census", action="append", metavar="FILE",
                   help="exactly the candidates `oasr tune build --census FILE` loads (repeatable)")
    p.add_argument("--thin", action="store_true", help="with --census: as the build's --thin")
    # the build's own types: what the build would refuse is refused here, not planned
    p.add_argument("--max-points", type=int_at_least(2), default=CENSUS_ONLY["max_points"],
                   help="with --census: as the build's --max-points")
    p.add_argument("--max-fill", type=int_at_least(0), default=CENSUS_ONLY["max_fill"],
                   help="with --census: as the build's --max-fill")
    p.add_argument("--no-prune", action="store_true", help="with --census: as the build's --no-prune")
    p.add_argument("--top-k", type=int_at_least(1), default=CENSUS_ONLY["top_k"],
                   help="with --census: as the build's --top-k")
    p.add_argument("--no-validate", action="store_true", help="with --census: as the build's --no-validate")
    p.add_argument("--arch", help="arch list, e.g. 9.0a (default: OASR_CUDA_ARCH_LIST)")
    p.add_argument("--dtypes", type=_dtypes, help=f"comma list of {','.join(DTYPES)} (default: all of them)")
    p.add_argument("--family", choices=prebuild_families(), help="one kernel family only (default: all)")
    p.add_argument("--jobs", type=_jobs, default=None,
                   help="parallel nvcc processes (default: the CPU count; capped by free memory)")
    # its own dest: as `quiet` it overwrote the global -q's count, so `oasr -q tune prebuild` logged at INFO
    p.add_argument("--quiet", "--no-progress", dest="no_progress", action="store_true",
                   help="no progress bar (the global -q also hides it)")
    h = p.add_mutually_exclusive_group()
    h.add_argument("--hot-path", action="store_true",
                   help="also build the C++ hot path of the oasr ops for this torch (backend=oasr uses it without CUDA "
                        "graphs; OASR_CPP_HOT_PATH=1)")
    h.add_argument("--hot-path-only", action="store_true", help="build only the C++ hot path (no arch needed)")
    p.set_defaults(func=_run)
