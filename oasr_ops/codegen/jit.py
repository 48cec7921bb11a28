"""JitSpec: one kernel's build lifecycle (key -> build -> load), and parallel builds within a budget.

Contract per method (each raises only what it says):
  JitSpec.key            pure; never raises.
  JitSpec.is_built()     never raises.
  JitSpec.build()        -> Path of the installed .so; raises BuildError (with the nvcc log path) on failure.
  JitSpec.load()         -> KernelLibrary; raises BuildError (build failed) or LoadError (dlopen / ABI mismatch).
  build_many(specs)      -> BuildReport; never raises for a failing kernel (it is reported), only for bad args.

The cache key hashes the rendered source, the header set (the CUTLASS version and our template set are part of
the source), the nvcc command line, the nvcc version and the target arch — nothing about the device, so a
kernel built on a CPU machine is found by a GPU machine running the same toolchain.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from filelock import FileLock

from ..configs import Config, Lane
from ..paths import cutlass_include_dirs, jit_dir, nvcc_path, nvcc_version  # noqa: F401  (re-exported)
from .render import ABI_VERSION, render

# Peak resident memory of one nvcc, measured on the CPU box (notes/cutlass.md), with headroom.
_MEM_PER_JOB = {"3x": 3.6e9, "2x": 0.8e9, "dw": 0.8e9}


class BuildError(RuntimeError):
    def __init__(self, message: str, log_path: Path | None = None):
        super().__init__(message if log_path is None else f"{message} (nvcc log: {log_path})")
        self.log_path = log_path


class LoadError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def cutlass_version() -> str:
    try:
        return metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        return "unknown"


def nvcc_flags(cuda_arch: str) -> tuple[str, ...]:
    inc = [f"-I{p}" for p in cutlass_include_dirs()]
    return (
        f"-gencode=arch=compute_{cuda_arch},code=sm_{cuda_arch}",
        "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-DNDEBUG",
        *inc,
        "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
        "-Xlinker", "--exclude-libs,ALL", "-cudart=static",
    )


def target_arch(lane: Lane, arch_family: str | None = None) -> str:
    """The nvcc target of a lane's kernels for a GPU family.

    3.x lanes build their own arch only (wgmma needs sm_90a exactly). The sm80 lane runs on every later family
    but SASS is not forward compatible, so it builds for the family it will run on: `arch_family` (the GPU
    being served), else the first entry of `OASR_CUDA_ARCH_LIST` (e.g. `9.0a` -> 90), else its own 80.
    """
    if lane.cuda_arch.endswith("a"):
        return lane.cuda_arch
    fam = arch_family
    if fam is None:
        env = os.environ.get("OASR_CUDA_ARCH_LIST", "").replace(";", " ").replace(",", " ").split()
        fam = env[0] if env else None
    if fam is None:
        return lane.cuda_arch
    digits = fam.lower().replace("sm_", "").replace("sm", "").replace(".", "").rstrip("a")
    return digits if digits.isdigit() and f"sm{digits}" in lane.arch_families else lane.cuda_arch


@dataclass
class KernelLibrary:
    """A loaded kernel `.so`: the C ABI functions with their argument types set once."""

    path: Path
    describe: str
    run: ctypes._CFuncPtr = field(repr=False)
    can_implement: ctypes._CFuncPtr = field(repr=False)
    workspace_size: ctypes._CFuncPtr = field(repr=False)


@dataclass(frozen=True)
class JitSpec:
    lane: Lane
    config: Config  # the kernel key (split-K stripped)
    dtype: str
    cuda_arch: str

    @staticmethod
    def for_kernel(lane: Lane, config: Config, dtype: str, arch_family: str | None = None) -> "JitSpec":
        return JitSpec(lane, config.kernel_key(), dtype, target_arch(lane, arch_family))

    @property
    def name(self) -> str:
        return f"{self.lane.name}_{self.config.id}_{self.dtype}_sm{self.cuda_arch}"

    @functools.cached_property
    def source(self) -> str:
        return render(self.lane, self.config, self.dtype)

    def command(self, src: Path, out: Path) -> list[str]:
        return [nvcc_path() or "nvcc", *nvcc_flags(self.cuda_arch), str(src), "-o", str(out)]

    @functools.cached_property
    def key(self) -> str:
        h = hashlib.sha256()
        for part in (self.source, f"cutlass={cutlass_version()}", " ".join(nvcc_flags_for_key(self.cuda_arch)),
                     f"nvcc={nvcc_version()}", f"arch={self.cuda_arch}", f"abi={ABI_VERSION}"):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:20]

    @property
    def so_path(self) -> Path:
        return jit_dir() / f"{self.name}-{self.key}.so"

    @property
    def log_path(self) -> Path:
        return jit_dir() / "logs" / f"{self.name}-{self.key}.log"

    @property
    def est_memory(self) -> float:
        return _MEM_PER_JOB[self.config.generation]

    def is_built(self) -> bool:
        try:
            return self.so_path.is_file()
        except OSError:
            return False

    def build(self) -> Path:
        """Compile unless present. Cross-process: a file lock per kernel with a re-check inside it; the .so is
        written to a temp name in the same directory and renamed into place, so readers never see a partial one."""
        if self.is_built():
            return self.so_path
        if nvcc_path() is None:
            raise BuildError(f"cannot build {self.name}: nvcc not found (set CUDA_HOME or put nvcc on PATH)")
        out = self.so_path
        out.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out) + ".lock"):
            if out.is_file():
                return out
            with tempfile.TemporaryDirectory(prefix=f".{self.name}-", dir=out.parent) as tmp:
                src = Path(tmp) / f"{self.name}.cu"
                src.write_text(self.source)
                tmp_so = Path(tmp) / f"{self.name}.so"
                cmd = self.command(src, tmp_so)
                t0 = time.monotonic()
                proc = subprocess.run(cmd, capture_output=True, text=True)
                dt = time.monotonic() - t0
                self.log_path.write_text(f"$ {' '.join(cmd)}\n# {dt:.1f}s rc={proc.returncode}\n"
                                         f"{proc.stdout}\n{proc.stderr}")
                if proc.returncode != 0 or not tmp_so.is_file():
                    # Keep the failing source beside its log for a bug report.
                    shutil.copy(src, self.log_path.with_suffix(".cu"))
                    raise BuildError(f"nvcc failed for {self.name} (rc={proc.returncode})", self.log_path)
                os.replace(tmp_so, out)
        return out

    def load(self) -> KernelLibrary:
        return _load(self.build())


def nvcc_flags_for_key(cuda_arch: str) -> tuple[str, ...]:
    # Include paths name site-packages locations that differ between machines; the CUTLASS version stands in
    # for the header set, so the key drops them.
    return tuple(f for f in nvcc_flags(cuda_arch) if not f.startswith("-I"))


_load_lock = threading.Lock()
_loaded: dict[Path, KernelLibrary] = {}


def _load(path: Path) -> KernelLibrary:
    with _load_lock:
        lib = _loaded.get(path)
        if lib is not None:
            return lib
        try:
            cdll = ctypes.CDLL(str(path))
        except OSError as e:
            raise LoadError(f"cannot load {path}: {e}") from None
        try:
            version = cdll.oasr_abi_version()
            if version != ABI_VERSION:
                raise LoadError(f"{path} has launcher ABI {version}, this oasr_ops expects {ABI_VERSION}")
            cdll.oasr_describe.restype = ctypes.c_char_p
            describe = cdll.oasr_describe().decode()
            i = ctypes.c_int
            run = cdll.oasr_run
            run.argtypes = [ctypes.c_void_p] * 4 + [i] * 5 + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            run.restype = i
            can = cdll.oasr_can_implement
            can.argtypes = [i] * 5
            can.restype = i
            ws = cdll.oasr_workspace_size
            ws.argtypes = [i] * 5
            ws.restype = ctypes.c_size_t
        except AttributeError as e:
            raise LoadError(f"{path} does not export the oasr C ABI: {e}") from None
        lib = KernelLibrary(path, describe, run, can, ws)
        _loaded[path] = lib
        return lib


def load_launcher(spec: "JitSpec", prefix: str, abi_version: int, run_args: list, shape_args: list
                  ) -> KernelLibrary:
    """A kernel family's own launcher in a built kernel: ``oasr_<prefix>_{run,can_implement,workspace_size}``
    (argument types `run_args` / `shape_args`) and ``oasr_<prefix>_abi_version`` == `abi_version`, on top of
    `spec.load()` (which builds if needed and checks the shared ABI). Raises BuildError / LoadError."""
    generic = spec.load()
    cdll = ctypes.CDLL(str(generic.path))
    try:
        version = getattr(cdll, f"oasr_{prefix}_abi_version")()
        if version != abi_version:
            raise LoadError(f"{generic.path} has {prefix} launcher ABI {version}, expected {abi_version}")
        fns = {}
        for name, args, restype in (("run", run_args, ctypes.c_int), ("can_implement", shape_args, ctypes.c_int),
                                    ("workspace_size", shape_args, ctypes.c_size_t)):
            fn = getattr(cdll, f"oasr_{prefix}_{name}")
            fn.argtypes, fn.restype = args, restype
            fns[name] = fn
    except AttributeError as e:
        raise LoadError(f"{generic.path} does not export the {prefix} C ABI: {e}") from None
    return KernelLibrary(generic.path, generic.describe, fns["run"], fns["can_implement"], fns["workspace_size"])


class KernelCache:
    """Loaded kernels by key, for the ops' plans. `get(key, load)` calls `load()` once per key; a BuildError or
    LoadError is remembered and raised again, so a process does not retry a failing build on every call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ok: dict = {}
        self._failed: dict = {}

    def get(self, key, load):
        lib = self._ok.get(key)
        if lib is not None:
            return lib
        with self._lock:
            if key in self._ok:
                return self._ok[key]
            if key in self._failed:
                raise BuildError(self._failed[key])
            try:
                lib = load()
            except (BuildError, LoadError) as e:
                self._failed[key] = str(e)
                raise
            self._ok[key] = lib
            return lib


@dataclass
class BuildReport:
    built: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> error (with log path)
    wall_s: float = 0.0

    def summary(self) -> str:
        lines = [f"built {len(self.built)}, reused {len(self.reused)}, failed {len(self.failed)} "
                 f"in {self.wall_s:.1f}s (JIT dir {jit_dir()})"]
        lines += [f"  built   {n}" for n in self.built]
        lines += [f"  reused  {n}" for n in self.reused]
        lines += [f"  FAILED  {n}: {e}" for n, e in self.failed.items()]
        return "\n".join(lines)


def _mem_available() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 8e9


def job_budget(specs: list[JitSpec], jobs: int | None = None) -> int:
    """Parallel nvcc processes: the asked-for (or CPU) count, capped so the largest jobs fit in free memory."""
    want = jobs or os.cpu_count() or 1
    if not specs:
        return 1
    per_job = max(s.est_memory for s in specs)
    return max(1, min(want, int(_mem_available() // per_job), len(specs)))


def build_many(specs: list[JitSpec], jobs: int | None = None, progress: bool = True) -> BuildReport:
    report = BuildReport()
    t0 = time.monotonic()
    todo = []
    for s in specs:
        (report.reused.append(s.name) if s.is_built() else todo.append(s))
    n_jobs = job_budget(todo, jobs)
    done = 0
    lock = threading.Lock()

    def one(s: JitSpec) -> None:
        nonlocal done
        try:
            s.build()
            ok, err = True, ""
        except BuildError as e:
            ok, err = False, str(e)
        with lock:
            done += 1
            (report.built.append(s.name) if ok else report.failed.__setitem__(s.name, err))
            if progress:
                _progress(done, len(todo), time.monotonic() - t0, s.name)

    if todo:
        if progress:
            _progress(0, len(todo), 0.0, f"{n_jobs} parallel jobs")
        with ThreadPoolExecutor(max_workers=n_jobs) as pool:
            list(pool.map(one, todo))
        if progress:
            sys.stderr.write("\n")
    report.wall_s = time.monotonic() - t0
    return report


def _progress(done: int, total: int, elapsed: float, what: str) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:6.0f}s  {what[:60]:<60}")
    sys.stderr.flush()
