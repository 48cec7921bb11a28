"""HostExtension: the build lifecycle of the C++ hot path (templates/hot_path.cpp), a torch extension compiled with
the host C++ compiler against the installed torch. The kernels' lifecycle (codegen/jit.py `CompiledLibrary`: the
same cache, trust rules, lock, atomic install with a sha256 manifest, verification right before the load); only the
compiler, its command and the key differ.

Contract per method (the rest as `CompiledLibrary`'s, codegen/jit.py):
  HostExtension.key        pure; never raises. Hashes the source, the compiler flags (include and library paths
                           left out: they name site-packages locations), the compiler's version and the torch version
                           (the extension links libtorch: unlike a kernel, it is specific to one torch build).
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
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..paths import templates_dir
from .cache_trust import BuildError, LoadError, _check_dir, _verify
from .jit import CompiledLibrary, content_key, on_demand_builds_allowed

HOT_PATH_ABI_VERSION = 4  # templates/hot_path.cpp kAbiVersion


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
class HostExtension(CompiledLibrary):
    """One C++ source under templates/, built into `<jit dir>/host_<source name>-<key>.so`."""

    source_name: str = "hot_path"
    abi_version: int = HOT_PATH_ABI_VERSION
    library_label = "C++ hot path library"
    compiler_label = "C++ compiler"
    compiler_hint = "set CXX or put c++/g++ on PATH"
    source_suffix = ".cpp"

    def compiler_path(self) -> str | None:
        return cxx_path()

    @property
    def name(self) -> str:
        return f"host_{self.source_name}"

    @functools.cached_property
    def source(self) -> str:
        return (templates_dir() / f"{self.source_name}.cpp").read_text()

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

        return content_key(self.source, " ".join(self._flags()), f"cxx={cxx_version()}", f"torch={torch.__version__}",
                           f"torch_git={getattr(torch.version, 'git_version', '')}", f"abi={self.abi_version}")

    def load(self) -> Path:
        import torch

        global _loaded_path
        path = _loaded_path or self.so_path  # a process holds one: its ops namespace registers once
        if _loaded_path is None:
            if _verify(path) is not None:
                if not on_demand_builds_allowed():
                    raise BuildError(f"the C++ hot path is not prebuilt ({path}) and OASR_JIT_BUILD=off forbids "
                                     "compiling it at run time; build it ahead: `oasr tune prebuild --hot-path-only`")
                self.build()
            if path.parent.exists():
                _check_dir(path.parent)  # UnsafeCacheError: never dlopen from a directory others can write
            why = _verify(path)  # checked right before the dlopen, as every kernel
            if why is not None:
                raise LoadError(f"{path} {why}")
            try:
                torch.ops.load_library(str(path))
            except OSError as e:
                raise LoadError(f"cannot load {path}: {e}") from None
            _loaded_path = path
        got = int(torch.ops.oasr_hot.abi_version())
        if got != self.abi_version:
            raise LoadError(f"{path}: ABI version {got}, expected {self.abi_version}")
        return path


_loaded_path: Path | None = None  # the library this process loaded (whatever the JIT directory says since)
