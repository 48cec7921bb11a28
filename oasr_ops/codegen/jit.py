"""JitSpec: one kernel's build lifecycle (key -> build -> verify -> load), and parallel builds within a budget.

Contract per method (each raises only what it says):
  JitSpec.key            pure; never raises.
  JitSpec.is_built()     never raises; True only for a `.so` whose sha256 matches its install manifest, in a
                         JIT directory that passes the safety check.
  JitSpec.build()        -> Path of the installed, verified .so; raises BuildError (with the nvcc log path) on
                         failure, UnsafeCacheError (a BuildError) when the JIT directory is unsafe. A `.so`
                         without a manifest or with a mismatching hash is never trusted: it is rebuilt, with a
                         warning naming it.
  JitSpec.load()         -> KernelLibrary; raises BuildError (build failed, unsafe directory) or LoadError
                         (dlopen / ABI mismatch). Builds when the .so is absent or unverified; a verified `.so`
                         that fails to load is rebuilt ONCE (warning naming it). At most one build per call: a
                         fresh build that fails to load raises LoadError. Nothing is dlopen'ed before its hash
                         is checked against the manifest, right before the dlopen. With OASR_JIT_BUILD=off a
                         kernel that is not prebuilt raises BuildError instead of compiling (a served process
                         that must never wait for nvcc: the caller's documented fallback runs, warned once).
  load_launcher(...)     as load(), plus the family's launcher symbols; raises BuildError / LoadError.
  KernelLibrary.run / can_implement / workspace_size
                         raise ValueError naming the argument when an integer does not fit its C type (ctypes
                         would truncate it silently: M = 2^31 would wrap to a negative int).
  build_many(specs)      -> BuildReport; never raises for a failing kernel (it is reported), only for bad args.

The cache key hashes the rendered source, the header set (the CUTLASS version and our template set are part of
the source), the nvcc command line, the nvcc version and the target arch — nothing about the device, so a
kernel built on a CPU machine is found by a GPU machine running the same toolchain.

Cache trust (a `.so` in the cache is code this process will execute):
- Directories are created 0700. The JIT directory and `logs/` below it are refused (UnsafeCacheError) when
  they are writable by group/others or owned by another user, as pip and Triton refuse theirs; the way out is
  `chmod 700 <dir>` as its owner, or `OASR_JIT_DIR` pointing at a directory only you can write.
- Install writes `<so>.sha256` (sha256sum format, 0600) after renaming the `.so` into place; loading checks
  the file's hash against it right before dlopen. Only our own user can write the directory, so the file
  cannot change between the check and the dlopen.
- nvcc runs in its own session under a small guard process that dies with the builder (PR_SET_PDEATHSIG on
  Linux) and then kills the session, so a SIGKILLed builder leaves no nvcc/cudafe++/cicc running. Temp build
  directories (`.<kernel>.build-<pid>-*`) are made under the kernel's file lock; a later build removes every
  one whose lock is free (its builder is gone).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from filelock import FileLock
from tqdm import tqdm

from .. import env as _env
from ..configs import Config, Lane
from ..paths import cutlass_include_dirs, jit_dir, nvcc_path, nvcc_version  # noqa: F401  (re-exported)
from .cache_trust import (BuildError, LoadError, UnsafeCacheError, _check_dir, _install, _run_nvcc,  # noqa: F401
                          _secure_dir, _sha256, _sweep_stale_builds, _verify, manifest_path)
from .loader import KernelLibrary, _BadLibrary, _load, _load_lock, _loaded, checked, load_launcher  # noqa: F401
from .render import ABI_VERSION, render

# Kernels this process compiled (names, in order): a served process that prebuilt its kernels should have none.
_COMPILED: list[str] = []


def compiled_in_process() -> tuple[str, ...]:
    """The kernels this process compiled with nvcc so far (prebuilds and on-first-use builds alike)."""
    return tuple(_COMPILED)


def on_demand_builds_allowed() -> bool:
    """False when ``OASR_JIT_BUILD=off``: `JitSpec.load` then never compiles (`build()` / `oasr tune prebuild` do)."""
    return _env.jit_build()


# Peak resident memory of one nvcc, measured on the CPU box (about 3.5 GB for a 3.x kernel), with headroom.
_MEM_PER_JOB = {"3x": 3.6e9, "2x": 0.8e9, "dw": 0.8e9, "dc": 0.8e9}


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


# ----------------------------------------------------------------------------------------------------------
# the build lifecycle (kernels and the C++ hot path)


def content_key(*parts: str) -> str:
    """The cache key of a build: sha256 over its parts, each NUL-terminated; 20 hex digits."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


class CompiledLibrary:
    """key -> build -> verify, shared by every `.so` this package compiles (the contract in the module docstring).
    A subclass gives `name`, `key`, `source`, `command(src, out)`, the compiler (`compiler_label`,
    `compiler_path()`, `compiler_hint`), the source file's suffix and what its messages call the library."""

    library_label = "kernel library"
    compiler_label = "nvcc"
    compiler_hint = "set CUDA_HOME or put nvcc on PATH"
    source_suffix = ".cu"
    name: str
    key: str
    source: str

    def compiler_path(self) -> str | None:
        return nvcc_path()

    def command(self, src: Path, out: Path) -> list[str]:
        raise NotImplementedError

    @property
    def so_path(self) -> Path:
        return jit_dir() / f"{self.name}-{self.key}.so"

    @property
    def log_path(self) -> Path:
        return jit_dir() / "logs" / f"{self.name}-{self.key}.log"

    def is_built(self) -> bool:
        try:
            _check_dir(self.so_path.parent)
            return _verify(self.so_path) is None
        except Exception:  # noqa: BLE001 - the contract: never raises
            return False

    def build(self) -> Path:
        """Compile unless a verified .so is present. Cross-process: a file lock per library with a re-check inside
        it; the .so is written in a temp directory beside it and renamed into place, then its manifest, so
        readers never see a partial one and never trust one without a manifest."""
        return self._build(None)

    def _build(self, bad_digest: str | None) -> Path:
        """build(); with `bad_digest` (the hash of a verified .so that failed to load), replace that file even
        though it verifies, unless another process already has."""
        out = self.so_path
        jdir = out.parent
        if bad_digest is None and jdir.exists():
            _check_dir(jdir)
            if _verify(out) is None:
                return out
        if self.compiler_path() is None:
            raise BuildError(f"cannot build {self.name}: {self.compiler_label} not found ({self.compiler_hint})")
        _secure_dir(jdir)
        _secure_dir(self.log_path.parent)
        try:  # the lock file and the sweep write too: a read-only or full cache is a BuildError, as in _compile
            with FileLock(str(out) + ".lock"):
                why = _verify(out)
                if why is None and (bad_digest is None or _sha256(out) != bad_digest):
                    return out  # built (again) by another process meanwhile
                if why not in (None, "missing"):
                    warnings.warn(f"oasr_ops: {self.library_label} {out} {why}; not loading it, rebuilding it",
                                  RuntimeWarning, stacklevel=3)
                _sweep_stale_builds(jdir, out.stem)
                self._compile(out, jdir)
        except OSError as e:
            raise BuildError(f"cannot build {self.name}: {e}", self.log_path) from None
        return out

    def _compile(self, out: Path, jdir: Path) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.stem}.build-{os.getpid()}-", dir=jdir))
        try:
            src = tmp / f"{self.name}{self.source_suffix}"
            src.write_text(self.source)
            tmp_so = tmp / f"{self.name}.so"
            cmd = self.command(src, tmp_so)
            t0 = time.monotonic()
            rc, stdout, stderr = _run_nvcc(cmd)  # the guarded runner (any compiler: killed with its builder)
            dt = time.monotonic() - t0
            self.log_path.write_text(f"$ {' '.join(cmd)}\n# {dt:.1f}s rc={rc}\n{stdout}\n{stderr}")
            if rc != 0 or not tmp_so.is_file() or tmp_so.stat().st_size == 0:
                # Keep the failing source beside its log for a bug report.
                shutil.copy(src, self.log_path.with_suffix(self.source_suffix))
                raise BuildError(f"{self.compiler_label} failed for {self.name} (rc={rc})", self.log_path)
            _install(tmp_so, out, tmp)
            _COMPILED.append(self.name)
        except OSError as e:
            raise BuildError(f"cannot build {self.name}: {e}", self.log_path) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# specs


@dataclass(frozen=True)
class JitSpec(CompiledLibrary):
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
        return content_key(self.source, f"cutlass={cutlass_version()}", " ".join(nvcc_flags_for_key(self.cuda_arch)),
                           f"nvcc={nvcc_version()}", f"arch={self.cuda_arch}", f"abi={ABI_VERSION}")

    @property
    def est_memory(self) -> float:
        return _MEM_PER_JOB[self.config.generation]

    def load(self) -> KernelLibrary:
        """Verify and load; build when absent or untrusted; rebuild once a verified file that fails to load.
        At most one build per call: never a loop."""
        path = self.so_path
        with _load_lock:
            lib = _loaded.get(path)
        if lib is not None:
            return lib
        try:
            return _load(path)
        except _BadLibrary as e:
            if e.digest is not None:  # it verified, yet did not load: corrupt or from a broken toolchain
                warnings.warn(f"oasr_ops: kernel library {path} failed to load ({e}); rebuilding it once",
                              RuntimeWarning, stacklevel=2)
            if not on_demand_builds_allowed():
                raise BuildError(f"{self.name} is not prebuilt ({e}) and OASR_JIT_BUILD=off forbids compiling it "
                                 f"at run time; build it ahead with `oasr tune prebuild`") from None
            self._build(e.digest)  # absent or unverified: build (warns when a file was there)
        try:
            return _load(path)
        except _BadLibrary as e:
            raise LoadError(f"{e} (freshly built)") from None


def nvcc_flags_for_key(cuda_arch: str) -> tuple[str, ...]:
    # Include paths name site-packages locations that differ between machines; the CUTLASS version stands in
    # for the header set, so the key drops them.
    return tuple(f for f in nvcc_flags(cuda_arch) if not f.startswith("-I"))


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
    lock = threading.Lock()
    # progress: a tqdm bar on stderr, only when it is a terminal (disable=None), so a log gets no carriage returns
    bar = tqdm(total=len(todo), desc=f"nvcc x{n_jobs}", unit="kernel", file=sys.stderr,
               disable=None if (progress and todo) else True)

    def one(s: JitSpec) -> None:
        try:
            s.build()
            ok, err = True, ""
        except BuildError as e:
            ok, err = False, str(e)
        with lock:
            (report.built.append(s.name) if ok else report.failed.__setitem__(s.name, err))
            bar.set_postfix_str(s.name[-40:], refresh=False)
            bar.update(1)

    if todo:
        with ThreadPoolExecutor(max_workers=n_jobs) as pool:
            list(pool.map(one, todo))
    bar.close()
    report.wall_s = time.monotonic() - t0
    return report
