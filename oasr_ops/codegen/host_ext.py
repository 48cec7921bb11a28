"""HostExtension: the build lifecycle of the C++ hot path (templates/hot_path.cpp), a torch extension compiled with
the host C++ compiler against the installed torch. The same cache, trust rules and lock as the kernels
(codegen/jit.py, codegen/cache_trust.py): content-keyed, built under a file lock, installed atomically with a
sha256 manifest, verified right before it is loaded.

Contract per method:
  HostExtension.key        pure; never raises. Hashes the source, the compiler command (include and library paths
                           left out: they name site-packages locations), the compiler's version and the torch version
                           (the extension links libtorch: unlike a kernel, it is specific to one torch build).
  HostExtension.is_built() never raises.
  HostExtension.build()    -> Path of the verified library; BuildError (with the log path) when the compiler fails
                           or is absent, UnsafeCacheError when the JIT directory is unsafe.
  HostExtension.load()     -> Path; registers the library's ops with torch (`torch.ops.load_library`) once per
                           process (a later call returns the library already loaded, whatever the JIT directory
                           says now: the ops' namespace registers once). Builds when absent or unverified unless
                           OASR_JIT_BUILD=off (then BuildError). LoadError when the loaded library's ABI version is
                           not the one this package expects.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..paths import jit_dir, templates_dir
from .cache_trust import (BuildError, LoadError, _check_dir, _install, _run_nvcc, _secure_dir, _sweep_stale_builds,
                          _verify)

HOT_PATH_ABI_VERSION = 1  # templates/hot_path.cpp kAbiVersion


@functools.lru_cache(maxsize=1)
def cxx_path() -> str | None:
    """The host C++ compiler: $CXX, else c++ / g++ on PATH."""
    cand = os.environ.get("CXX", "").strip()
    if cand:
        return shutil.which(cand) or (cand if Path(cand).is_file() else None)
    return shutil.which("c++") or shutil.which("g++")


@functools.lru_cache(maxsize=1)
def cxx_version() -> str:
    exe = cxx_path()
    if exe is None:
        return "none"
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


@dataclass(frozen=True)
class HostExtension:
    """One C++ source under templates/, built into `<jit dir>/<name>-<key>.so`."""

    name: str = "hot_path"
    abi_version: int = HOT_PATH_ABI_VERSION

    @functools.cached_property
    def source(self) -> str:
        return (templates_dir() / f"{self.name}.cpp").read_text()

    @staticmethod
    def _flags() -> list[str]:
        import torch

        return ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
                f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]

    @staticmethod
    def _paths() -> tuple[list[str], list[str]]:
        from torch.utils import cpp_extension

        libs = cpp_extension.library_paths()
        return ([f"-I{p}" for p in cpp_extension.include_paths()],
                [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs] + ["-lc10", "-ltorch_cpu", "-ltorch"])

    def command(self, src: Path, out: Path) -> list[str]:
        inc, link = self._paths()
        return [cxx_path() or "c++", *self._flags(), *inc, str(src), "-o", str(out), *link]

    @functools.cached_property
    def key(self) -> str:
        import torch

        h = hashlib.sha256()
        for part in (self.source, " ".join(self._flags()), f"cxx={cxx_version()}", f"torch={torch.__version__}",
                     f"torch_git={getattr(torch.version, 'git_version', '')}", f"abi={self.abi_version}"):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:20]

    @property
    def so_path(self) -> Path:
        return jit_dir() / f"host_{self.name}-{self.key}.so"

    @property
    def log_path(self) -> Path:
        return jit_dir() / "logs" / f"host_{self.name}-{self.key}.log"

    def is_built(self) -> bool:
        try:
            _check_dir(self.so_path.parent)
            return _verify(self.so_path) is None
        except Exception:  # noqa: BLE001 - the contract: never raises
            return False

    def build(self) -> Path:
        from filelock import FileLock

        out = self.so_path
        jdir = out.parent
        if jdir.exists():
            _check_dir(jdir)
            if _verify(out) is None:
                return out
        if cxx_path() is None:
            raise BuildError(f"cannot build {self.name}: no C++ compiler (set CXX or put c++/g++ on PATH)")
        _secure_dir(jdir)
        _secure_dir(self.log_path.parent)
        with FileLock(str(out) + ".lock"):
            if _verify(out) is None:
                return out  # built by another process meanwhile
            _sweep_stale_builds(jdir, out.stem)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.stem}.build-{os.getpid()}-", dir=jdir))
            try:
                src, tmp_so = tmp / f"{self.name}.cpp", tmp / f"{self.name}.so"
                src.write_text(self.source)
                cmd = self.command(src, tmp_so)
                t0 = time.monotonic()
                rc, stdout, stderr = _run_nvcc(cmd)  # the guarded runner: any compiler, killed with its builder
                self.log_path.write_text(f"$ {' '.join(cmd)}\n# {time.monotonic() - t0:.1f}s rc={rc}\n{stdout}\n{stderr}")
                if rc != 0 or not tmp_so.is_file() or tmp_so.stat().st_size == 0:
                    raise BuildError(f"the C++ compiler failed for {self.name} (rc={rc})", self.log_path)
                _install(tmp_so, out, tmp)
            except OSError as e:
                raise BuildError(f"cannot build {self.name}: {e}", self.log_path) from None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return out

    def load(self) -> Path:
        import torch

        from .jit import on_demand_builds_allowed

        path = self.so_path
        if _LOADED and str(path) not in _LOADED:
            # A process holds one: its ops namespace cannot be registered twice (a JIT directory changed since).
            path = Path(next(iter(_LOADED)))
        if str(path) not in _LOADED:
            if _verify(path) is not None:
                if not on_demand_builds_allowed():
                    raise BuildError(f"the C++ hot path is not prebuilt ({path}) and OASR_JIT_BUILD=off forbids "
                                     "compiling it at run time; build it ahead with `oasr tune prebuild`")
                self.build()
            why = _verify(path)  # checked right before the dlopen, as every kernel
            if why is not None:
                raise LoadError(f"{path} {why}")
            try:
                torch.ops.load_library(str(path))
            except OSError as e:
                raise LoadError(f"cannot load {path}: {e}") from None
            _LOADED.add(str(path))
        got = int(torch.ops.oasr_hot.abi_version())
        if got != self.abi_version:
            raise LoadError(f"{path}: ABI version {got}, expected {self.abi_version}")
        return path


_LOADED: set[str] = set()
