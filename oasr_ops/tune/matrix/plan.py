"""What an `oasr tune matrix` run does, computed on the client without a GPU, nvcc or Dask (`--dry-run` prints
it): per arch, per family the native lane and the signatures to measure (the build's points and arm plan), the
JIT modules each needs, grouped into one compile task per (arch, lane); which signatures a resumed run
(`--run-id`) has already finished.

Layout under ``--out`` (default ``.artifacts/tune_matrix``; a directory every worker sees, e.g. a shared volume):

  sm<arch>/<family>.json                 the tuning file (review with `oasr tune diff`; promoting it into db/ is
                                          a reviewed change, never automatic)
  sm<arch>/<family>_measurements.jsonl   the measurement log (`oasr tune evaluate --log`, `build --from-log`)
  sm<arch>/compile.json, sm<arch>/run.json   the compile and run reports (run.json: any module a GPU still
                                          had to compile, failures, per-worker times)
  runs/<run id>/plan.json                the run's options (a resumed run must match them)
  runs/<run id>/sm<arch>/<family>/ckpt/  one checkpoint per finished signature (build.write_checkpoint)
  runs/<run id>/sm<arch>/<family>/logs/  one measurement log per finished signature
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...paths import write_text_atomic
from ...runtime import registry
from ..build import BuildOptions, SignatureWork, arm_plan, load_works, plan_signature, read_checkpoint
from ..candidates import tunable_families
from ..prune import TOP_K

DEFAULT_OUT = Path(".artifacts/tune_matrix")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# the options a signature's measurement depends on: a run resumed under others would mix two builds
_MEASURE_KEYS = ("thin", "max_points", "max_fill", "rounds", "min_speedup", "max_loss", "prune", "top_k", "validate")


@dataclass
class MatrixOptions:
    census: list[str]
    archs: list[str]
    families: list[str] | None = None  # None: every tunable family with signatures in the census
    out: Path = DEFAULT_OUT
    run_id: str = ""
    thin: bool = True  # spec: the GPU stage builds with --thin at 16 points per signature
    max_points: int = 16
    max_fill: int = 8
    rounds: int = 5
    min_speedup: float = 1.05
    max_loss: float = 0.02
    prune: bool = True
    top_k: int = TOP_K
    validate: bool = True
    jobs: int | None = None  # nvcc processes per compile task (default: the compile worker's CPU count)
    measurer: str | None = None  # "module:function" replacing the GPU measurement (a test double)

    def run_dir(self) -> Path:
        return Path(self.out) / "runs" / self.run_id

    def pair_dir(self, arch: str, family: str) -> Path:
        return self.run_dir() / arch / family

    def build_options(self, family: str, arch: str) -> BuildOptions:
        """The `oasr tune build` options one (arch, family) is measured with (checkpoints in the run)."""
        return BuildOptions(out=str(self.out), family=family, fresh=True, thin=self.thin, max_points=self.max_points,
                            max_fill=self.max_fill, min_speedup=self.min_speedup, max_loss=self.max_loss,
                            rounds=self.rounds, arch=arch, progress=False, prune=self.prune, top_k=self.top_k,
                            validate=self.validate, checkpoint_dir=self.pair_dir(arch, family) / "ckpt")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    if not _RUN_ID_RE.match(run_id):
        raise UsageError(f"--run-id {run_id!r}: letters, digits, '.', '_' and '-' only (it names a directory)")
    return run_id


def fingerprint(mo: MatrixOptions) -> dict[str, Any]:
    """What the run's measurements depend on: the census contents and the measuring options."""
    digests = sorted(hashlib.sha256(Path(c).read_bytes()).hexdigest()[:16] for c in mo.census)
    return {"census": digests, **{k: getattr(mo, k) for k in _MEASURE_KEYS}}


def record_run(mo: MatrixOptions, write: bool = True) -> bool:
    """Write runs/<id>/plan.json for a new run (unless not `write`); for an existing one check it was planned
    with the same census and measuring options (UsageError naming the difference). Returns True when the run
    existed (a resume)."""
    path = mo.run_dir() / "plan.json"
    fp = fingerprint(mo)
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise UsageError(f"--run-id {mo.run_id}: {path} is unreadable ({e})") from None
        old = doc.get("fingerprint") if isinstance(doc, dict) else None
        if not isinstance(old, dict):  # a hand-edited or foreign file: comparing it would raise mid-run
            raise UsageError(f"--run-id {mo.run_id}: {path} is not a run plan (no 'fingerprint' object); move it "
                             "or pick another --run-id")
        diff = sorted(k for k in set(fp) | set(old) if fp.get(k) != old.get(k))
        if diff:
            raise UsageError(f"--run-id {mo.run_id} was planned with other {', '.join(diff)} "
                             f"({', '.join(f'{k}={old.get(k)!r}' for k in diff)}); resume it with those")
        return True
    if not write:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"run_id": mo.run_id, "fingerprint": fp, "archs": mo.archs,
                                        "families": mo.families, "created": time.time()}, indent=1))
    return False


@dataclass(frozen=True)
class Module:
    """One JIT module (a JitSpec by value: what a task needs to rebuild it on another machine)."""
    lane: str
    config: str
    dtype: str
    cuda_arch: str

    @staticmethod
    def of(spec: Any) -> "Module":
        return Module(spec.lane.name, spec.config.id, spec.dtype, spec.cuda_arch)

    def spec(self) -> Any:
        return _spec_of(self)

    @property
    def name(self) -> str:
        return f"{self.lane}_{self.config}_{self.dtype}_sm{self.cuda_arch}"


@functools.lru_cache(maxsize=None)
def _spec_of(m: Module) -> Any:
    """One JitSpec per module and process: its content key (a render and a hash) is computed once."""
    from ...codegen.jit import JitSpec
    from ...configs import parse

    return JitSpec(registry.get_lane(m.lane), parse(m.config), m.dtype, m.cuda_arch)


@dataclass
class MeasureTask:
    arch: str
    family: str
    lane: str
    work: SignatureWork
    points: int
    arms: int  # (point, arm) measurements before cross-evaluation
    modules: list[Module]
    done: bool = False  # a checkpoint of this run holds it

    @property
    def signature(self) -> str:
        return self.work.signature


@dataclass
class CompileTask:
    arch: str
    lane: str
    modules: list[Module]


@dataclass
class ArchPlan:
    arch: str
    lanes: dict[str, str] = field(default_factory=dict)  # family -> native lane measured
    measure: list[MeasureTask] = field(default_factory=list)
    compile: list[CompileTask] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # family -> why it is not built here

    def todo(self) -> list[MeasureTask]:
        return [t for t in self.measure if not t.done]


@dataclass
class MatrixPlan:
    options: MatrixOptions
    archs: list[ArchPlan]

    def summary(self, built: bool = False) -> dict[str, Any]:
        """The plan as JSON (`--dry-run`). `built`: also count the modules already in the JIT cache."""
        out: dict[str, Any] = {"run_id": self.options.run_id, "out": str(self.options.out), "archs": {}}
        tot = {"signatures": 0, "todo": 0, "points": 0, "arms": 0, "modules": 0}
        for ap in self.archs:
            fams: dict[str, Any] = {}
            for fam, lane in ap.lanes.items():
                ts = [t for t in ap.measure if t.family == fam]
                fams[fam] = {"lane": lane, "signatures": len(ts), "done": sum(t.done for t in ts),
                             "points": sum(t.points for t in ts if not t.done),
                             "arms": sum(t.arms for t in ts if not t.done)}
            comp = {}
            for c in ap.compile:
                comp[c.lane] = {"modules": len(c.modules)}
                if built:
                    comp[c.lane]["in_jit_cache"] = sum(m.spec().is_built() for m in c.modules)
            out["archs"][ap.arch] = {"families": fams, "compile_tasks": comp, "measure_tasks": len(ap.todo()),
                                     "skipped": ap.skipped}
            tot["signatures"] += len(ap.measure)
            tot["todo"] += len(ap.todo())
            tot["points"] += sum(t.points for t in ap.todo())
            tot["arms"] += sum(t.arms for t in ap.todo())
            tot["modules"] += sum(len(c.modules) for c in ap.compile)
        out["totals"] = tot
        out["options"] = {k: v for k, v in asdict(self.options).items() if k not in ("out", "run_id")}
        return out


def make_plan(mo: MatrixOptions) -> MatrixPlan:
    """Plan every (arch, family) of the run: deterministic from the census, the options and the archs' tuning
    files (the cost model pruning ranks with), as `oasr tune prebuild --census` plans."""
    from ..prebuild import signature_specs

    fams = mo.families or tunable_families()
    plans = []
    for arch in mo.archs:
        ap = ArchPlan(arch)
        for fam in fams:
            lane = registry.native_lane(arch, fam)
            works = load_works(mo.census, fam)
            if lane is None:
                if mo.families:  # asked for by name: say why there is nothing
                    ap.skipped[fam] = f"no {fam} lane is native to {arch}"
                continue
            if not works:
                if mo.families:
                    ap.skipped[fam] = f"no {fam} signatures in the census"
                continue
            ap.lanes[fam] = lane.name
            bopts = mo.build_options(fam, arch)
            for sig, work in works.items():
                points = plan_signature(work, bopts)
                arms = sum(len(v) for v in arm_plan(sig, points, bopts, arch).values())
                mods = [Module.of(s) for s in signature_specs(work, bopts, arch)]
                done = read_checkpoint(bopts.checkpoint_dir, sig) is not None
                ap.measure.append(MeasureTask(arch, fam, lane.name, work, len(points), arms, mods, done))
        by_lane: dict[str, dict[Module, None]] = {}
        for t in ap.todo():  # a finished signature needs no module
            for m in t.modules:
                by_lane.setdefault(m.lane, {})[m] = None
        ap.compile = [CompileTask(arch, lane, list(mods)) for lane, mods in sorted(by_lane.items())]
        plans.append(ap)
    return MatrixPlan(mo, plans)
