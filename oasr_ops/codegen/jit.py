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
                         is checked against the manifest, right before the dlopen.
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

import ctypes
import functools
import hashlib
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from operator import itemgetter
from pathlib import Path
from typing import Callable

from filelock import FileLock

from ..configs import Config, Lane
from ..paths import cutlass_include_dirs, jit_dir, nvcc_path, nvcc_version  # noqa: F401  (re-exported)
from .render import ABI_VERSION, render

# Peak resident memory of one nvcc, measured on the CPU box (notes/cutlass.md), with headroom.
_MEM_PER_JOB = {"3x": 3.6e9, "2x": 0.8e9}


class BuildError(RuntimeError):
    def __init__(self, message: str, log_path: Path | None = None):
        super().__init__(message if log_path is None else f"{message} (nvcc log: {log_path})")
        self.log_path = log_path


class LoadError(RuntimeError):
    pass


class UnsafeCacheError(BuildError):
    """The JIT directory could be written by someone else: nothing in it is built or loaded."""


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
# cache trust: directory checks, install manifests

def _check_dir(d: Path) -> None:
    """Raise UnsafeCacheError unless `d` is a directory owned by this user and writable by no one else."""
    try:
        st = d.stat()
    except OSError as e:
        raise UnsafeCacheError(f"cannot use JIT cache directory {d}: {e}") from None
    problems = []
    if not stat.S_ISDIR(st.st_mode):
        problems.append("it is not a directory")
    if st.st_uid != os.getuid():
        problems.append(f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})")
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[st.st_mode & 0o022]
        problems.append(f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})")
    if problems:
        raise UnsafeCacheError(
            f"refusing JIT cache directory {d}: {'; '.join(problems)}. Another user could plant a kernel library "
            f"there that this process would execute. Fix: `chmod 700 {d}` as its owner, or set OASR_JIT_DIR to a "
            "directory only you can write")


def _secure_dir(d: Path) -> Path:
    """Create `d` (and missing parents) 0700, then check it."""
    missing = []
    for cand in (d, *d.parents):
        if cand.exists():
            break
        missing.append(cand)
    for cand in reversed(missing):
        try:
            cand.mkdir(mode=0o700)
            cand.chmod(0o700)  # mkdir's mode is masked by the umask
        except FileExistsError:
            pass  # another process made it
        except OSError as e:
            raise BuildError(f"cannot create JIT cache directory {cand}: {e}") from None
    _check_dir(d)
    return d


def manifest_path(so: Path) -> Path:
    return so.with_name(so.name + ".sha256")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _own_file(path: Path) -> str | None:
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return f"is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o} (not yours alone)"
    return None


def _verify(so: Path) -> str | None:
    """None when `so` is installed and matches its manifest; else why not ("missing" when there is no .so)."""
    try:
        if not so.exists():
            return "missing"
        why = _own_file(so)
        if why:
            return why
        man = manifest_path(so)
        if not man.exists():
            return "has no install manifest (not built by this oasr_ops)"
        why = _own_file(man)
        if why:
            return f"has a manifest that {why}"
        recorded = man.read_text().split()[:1]
        actual = _sha256(so)
    except OSError as e:
        return f"cannot be checked ({e})"
    if recorded != [actual]:
        was = (recorded or ["nothing"])[0][:12]
        return f"does not match its install manifest (sha256 {actual[:12]}..., recorded {was}...)"
    return None


def _install(tmp_so: Path, out: Path, tmp_dir: Path) -> None:
    """Rename the built .so into place, then its manifest (atomic each; a crash between leaves a .so without a
    manifest, which is rebuilt, never loaded)."""
    digest = _sha256(tmp_so)
    tmp_man = tmp_dir / "manifest"
    fd = os.open(tmp_man, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{digest}  {out.name}\n")  # `sha256sum -c` format
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp_so, 0o755)
    os.replace(tmp_so, out)
    os.replace(tmp_man, manifest_path(out))


# ----------------------------------------------------------------------------------------------------------
# nvcc under a guard that dies with the builder; stale temp directories

# Run as `python -I -S -c _GUARD <builder pid> nvcc ...` in a new session. The guard asks the kernel for SIGTERM
# when its parent dies (a SIGKILLed builder cannot clean up) and then kills its whole process group: nvcc and
# the cudafe++/cicc/ptxas/gcc it spawned (PR_SET_PDEATHSIG is not inherited by them).
_GUARD = """
import ctypes, os, signal, subprocess, sys
def die(*_):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, die)
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG (Linux)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    die()  # the builder died before the prctl
sys.exit(subprocess.call(sys.argv[2:]))
"""


def _run_nvcc(cmd: list[str]) -> tuple[int, str, str]:
    argv = [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), *cmd] if sys.executable else cmd
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate()
    except BaseException:  # e.g. KeyboardInterrupt while waiting: take the whole build down with us
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        raise
    return proc.returncode, out, err


_TMP_DIR = re.compile(r"^\.(?P<stem>.+)\.build-(?P<pid>\d+)-[^/]*$")


def _sweep_stale_builds(jdir: Path, own_stem: str) -> None:
    """Remove temp build directories whose builder is gone. A build dir is made under its kernel's file lock,
    so one whose lock we can take (or our own kernel's, whose lock we hold) belongs to no running build."""
    try:
        entries = list(os.scandir(jdir))
    except OSError:
        return
    for entry in entries:
        m = _TMP_DIR.match(entry.name)
        if m is None or not entry.is_dir(follow_symlinks=False):
            continue
        if m["stem"] == own_stem:
            shutil.rmtree(entry.path, ignore_errors=True)
            continue
        lock = FileLock(str(jdir / f"{m['stem']}.so.lock"), timeout=0)
        try:
            lock.acquire()
        except TimeoutError:  # filelock.Timeout: that kernel is being built now
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            lock.release()


# ----------------------------------------------------------------------------------------------------------
# specs


@dataclass
class KernelLibrary:
    """A loaded kernel `.so`: the C ABI functions with their argument types set once (wrapped so that an integer
    argument that does not fit its C type raises ValueError instead of wrapping)."""

    path: Path
    describe: str
    run: Callable[..., int] = field(repr=False)
    can_implement: Callable[..., int] = field(repr=False)
    workspace_size: Callable[..., int] = field(repr=False)
    handle: ctypes.CDLL | None = field(default=None, repr=False)


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
            _check_dir(self.so_path.parent)
            return _verify(self.so_path) is None
        except Exception:  # noqa: BLE001 - the contract: never raises
            return False

    def build(self) -> Path:
        """Compile unless a verified .so is present. Cross-process: a file lock per kernel with a re-check inside
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
        if nvcc_path() is None:
            raise BuildError(f"cannot build {self.name}: nvcc not found (set CUDA_HOME or put nvcc on PATH)")
        _secure_dir(jdir)
        _secure_dir(self.log_path.parent)
        with FileLock(str(out) + ".lock"):
            why = _verify(out)
            if why is None and (bad_digest is None or _sha256(out) != bad_digest):
                return out  # built (again) by another process meanwhile
            if why not in (None, "missing"):
                warnings.warn(f"oasr_ops: kernel library {out} {why}; not loading it, rebuilding it",
                              RuntimeWarning, stacklevel=3)
            _sweep_stale_builds(jdir, out.stem)
            self._compile(out, jdir)
        return out

    def _compile(self, out: Path, jdir: Path) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.stem}.build-{os.getpid()}-", dir=jdir))
        try:
            src = tmp / f"{self.name}.cu"
            src.write_text(self.source)
            tmp_so = tmp / f"{self.name}.so"
            cmd = self.command(src, tmp_so)
            t0 = time.monotonic()
            rc, stdout, stderr = _run_nvcc(cmd)
            dt = time.monotonic() - t0
            self.log_path.write_text(f"$ {' '.join(cmd)}\n# {dt:.1f}s rc={rc}\n{stdout}\n{stderr}")
            if rc != 0 or not tmp_so.is_file() or tmp_so.stat().st_size == 0:
                # Keep the failing source beside its log for a bug report.
                shutil.copy(src, self.log_path.with_suffix(".cu"))
                raise BuildError(f"nvcc failed for {self.name} (rc={rc})", self.log_path)
            _install(tmp_so, out, tmp)
        except OSError as e:
            raise BuildError(f"cannot build {self.name}: {e}", self.log_path) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

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
            self._build(e.digest)  # absent or unverified: build (warns when a file was there)
        try:
            return _load(path)
        except _BadLibrary as e:
            raise LoadError(f"{e} (freshly built)") from None


def nvcc_flags_for_key(cuda_arch: str) -> tuple[str, ...]:
    # Include paths name site-packages locations that differ between machines; the CUTLASS version stands in
    # for the header set, so the key drops them.
    return tuple(f for f in nvcc_flags(cuda_arch) if not f.startswith("-I"))


# ----------------------------------------------------------------------------------------------------------
# loading: verify, dlopen, typed and range-checked C functions

class _BadLibrary(LoadError):
    """A library that failed verification or loading; `digest` is its content hash (None: unreadable)."""

    def __init__(self, message: str, digest: str | None):
        super().__init__(message)
        self.digest = digest


_INT_CODES = frozenset("bBhHiIlLqQ")  # ctypes `_type_` codes of integer types = struct format codes


def checked(fn, argtypes: list, restype, names: list[str] | None = None) -> Callable[..., int]:
    """Set `fn`'s C signature and return a caller that rejects an integer argument outside its C type's range
    (ValueError naming it) instead of letting ctypes truncate it. One struct.pack checks them all: its format
    codes are ctypes' own, so the ranges are the C ones."""
    fn.argtypes, fn.restype = argtypes, restype
    idx = tuple(i for i, t in enumerate(argtypes) if getattr(t, "_type_", None) in _INT_CODES)
    if not idx:
        return fn
    fmt = "".join(argtypes[i]._type_ for i in idx)
    pack = struct.Struct("@" + fmt).pack
    # itemgetter of one index returns the item, of several a tuple
    take = itemgetter(*idx) if len(idx) > 1 else (lambda a, _i=idx[0]: (a[_i],))
    fname = getattr(fn, "__name__", "launcher")

    def call(*args):
        try:
            pack(*take(args))
        except struct.error:
            _raise_range(fname, args, idx, argtypes, names)
        except IndexError:
            pass  # a wrong argument count: ctypes says so
        return fn(*args)

    call.__name__ = fname
    return call


def _raise_range(fname: str, args: tuple, idx: tuple, argtypes: list, names: list[str] | None) -> None:
    for i in idx:
        t = argtypes[i]
        try:
            struct.pack("@" + t._type_, args[i])
        except struct.error:
            name = names[i] if names and i < len(names) else f"#{i}"
            bits = 8 * ctypes.sizeof(t)
            v = args[i]
            if not isinstance(v, int) and not hasattr(v, "__index__"):
                raise TypeError(f"{fname}: argument {name} must be an integer ({t.__name__}), got {v!r}") from None
            raise ValueError(f"{fname}: argument {name} = {v} does not fit the launcher's {bits}-bit "
                             f"{t.__name__} (ctypes would silently wrap it); split the call") from None


_load_lock = threading.Lock()
_loaded: dict[Path, KernelLibrary] = {}
_RUN_NAMES = ["a", "w", "bias", "out", "m", "n", "k", "split_k", "act", "workspace", "workspace_bytes", "stream"]
_SHAPE_NAMES = ["m", "n", "k", "split_k", "act"]


def _dlopen_verified(path: Path) -> tuple[ctypes.CDLL, str]:
    """dlopen `path` only if it matches its install manifest (hash checked here, right before the dlopen)."""
    if not path.parent.exists():
        raise _BadLibrary(f"{path} is missing", None)
    _check_dir(path.parent)  # UnsafeCacheError (a BuildError)
    why = _verify(path)
    if why is not None:
        raise _BadLibrary(f"{path} {why}", None)
    try:
        digest = manifest_path(path).read_text().split()[0]
    except (OSError, IndexError) as e:  # replaced under us since _verify
        raise _BadLibrary(f"{path}: manifest unreadable ({e})", None) from None
    try:
        return ctypes.CDLL(str(path)), digest
    except OSError as e:
        raise _BadLibrary(f"cannot load {path}: {e}", digest) from None


def _load(path: Path) -> KernelLibrary:
    """The generic (gemm) C ABI of a built kernel, cached per path; raises LoadError (_BadLibrary: rebuildable)."""
    with _load_lock:
        lib = _loaded.get(path)
        if lib is not None:
            return lib
        cdll, digest = _dlopen_verified(path)
        try:
            version = cdll.oasr_abi_version()
            if version != ABI_VERSION:
                raise _BadLibrary(f"{path} has launcher ABI {version}, this oasr_ops expects {ABI_VERSION}", digest)
            cdll.oasr_describe.restype = ctypes.c_char_p
            describe = cdll.oasr_describe().decode()
            i = ctypes.c_int
            run = checked(cdll.oasr_run, [ctypes.c_void_p] * 4 + [i] * 5 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                           ctypes.c_void_p], i, _RUN_NAMES)
            can = checked(cdll.oasr_can_implement, [i] * 5, i, _SHAPE_NAMES)
            ws = checked(cdll.oasr_workspace_size, [i] * 5, ctypes.c_size_t, _SHAPE_NAMES)
        except (AttributeError, _BadLibrary) as e:
            _dlclose(cdll)  # so that a rebuilt file at this path is really loaded, not this handle again
            if isinstance(e, _BadLibrary):
                raise
            raise _BadLibrary(f"{path} does not export the oasr C ABI: {e}", digest) from None
        lib = KernelLibrary(path, describe, run, can, ws, cdll)
        _loaded[path] = lib
        return lib


def _dlclose(cdll: ctypes.CDLL) -> None:
    try:
        import _ctypes

        _ctypes.dlclose(cdll._handle)
    except (ImportError, AttributeError, OSError):
        pass


def load_launcher(spec: "JitSpec", prefix: str, abi_version: int, run_args: list, shape_args: list,
                  run_names: list[str] | None = None, shape_names: list[str] | None = None) -> KernelLibrary:
    """A kernel family's own launcher in a built kernel: ``oasr_<prefix>_{run,can_implement,workspace_size}``
    (argument types `run_args` / `shape_args`, optional names for error messages) and
    ``oasr_<prefix>_abi_version`` == `abi_version`, on top of `spec.load()` (which builds if needed, verifies
    and checks the shared ABI). Integer arguments are range-checked per call (`checked`).
    Raises BuildError / LoadError."""
    generic = spec.load()
    cdll = generic.handle  # the verified handle: never dlopen the path again (it could have been replaced)
    try:
        version = getattr(cdll, f"oasr_{prefix}_abi_version")()
        if version != abi_version:
            raise LoadError(f"{generic.path} has {prefix} launcher ABI {version}, expected {abi_version}")
        fns = {}
        for name, args, restype, names in (("run", run_args, ctypes.c_int, run_names),
                                           ("can_implement", shape_args, ctypes.c_int, shape_names),
                                           ("workspace_size", shape_args, ctypes.c_size_t, shape_names)):
            fns[name] = checked(getattr(cdll, f"oasr_{prefix}_{name}"), args, restype, names)
    except AttributeError as e:
        raise LoadError(f"{generic.path} does not export the {prefix} C ABI: {e}") from None
    return KernelLibrary(generic.path, generic.describe, fns["run"], fns["can_implement"], fns["workspace_size"],
                         cdll)


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
