"""Every filesystem path the package uses, resolved in one place."""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import time
import warnings
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _package_or_repo(name: str) -> Path:
    # Installed wheels carry templates/ and db/ inside the package; an editable install or a source checkout
    # keeps them at the repository root beside oasr_ops/.
    for cand in (_PKG / name, _PKG.parent / name):
        if cand.is_dir():
            return cand
    return _PKG / name


def templates_dir() -> Path:
    return _package_or_repo("templates")


def system_db_dir() -> Path:
    """The shipped tier: db/sm<family>/<kernel family>.json."""
    return _package_or_repo("db")


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "oasr"


def user_db_dir() -> Path | None:
    """The user tier, or None when `OASR_TUNE_USER_DB=off`."""
    v = os.environ.get("OASR_TUNE_USER_DB", "").strip()
    if v.lower() == "off":
        return None
    return Path(v).expanduser() if v else cache_root() / "tune" / "v2"


def jit_dir() -> Path:
    v = os.environ.get("OASR_JIT_DIR", "").strip()
    return Path(v).expanduser() if v else cache_root() / "jit"


def import_cutlass_library():
    """`import cutlass_library` without letting it read our command line.

    cutlass_library 4.2's generator runs `argparse.parse_known_args()` at import: under `oasr tune --help` it
    printed its own help and exited. It sees only argv[0] here.
    """
    import sys

    saved = sys.argv
    sys.argv = saved[:1]
    try:
        import cutlass_library  # its __init__ imports gemm_operation, library and the generator
    finally:
        sys.argv = saved
    return cutlass_library


def cutlass_include_dirs() -> list[Path]:
    """CUTLASS headers as shipped in the nvidia-cutlass wheel (cutlass_library/source)."""
    src = Path(import_cutlass_library().__file__).resolve().parent / "source"
    return [src / "include", src / "tools" / "util" / "include"]


# The CUDA compiler: where it is (a path, like everything here) and which release (the JIT key and the DB's
# `nvcc` soft validator both need it).
@functools.lru_cache(maxsize=1)
def nvcc_path() -> str | None:
    cand = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cand and Path(cand, "bin", "nvcc").exists():
        return str(Path(cand, "bin", "nvcc"))
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str | None:
    """`release X.Y, VX.Y.Z` line of `nvcc --version`, or None without nvcc."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.splitlines() if "release" in ln or ln.startswith("Build")]
    return " ".join(lines) or out.strip()


def write_text_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write `text` (+ a newline) to `path` so a reader sees the old file or the new one, never a torn one: a
    temp file in the same directory, fsync, rename over `path`, fsync the directory. `mode`: the permission bits
    to give the file (e.g. the replaced file's); None: 0644 minus the umask. Every writer of a file another
    process may read at the same time uses this (tuning DB, autotune cache, ArchProfile cache)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:  # mode 0o644 here: the kernel applies the umask, with no process-wide umask juggling
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            continue
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def aside_path(path: Path) -> Path:
    """A free `<name>.corrupt-<UTC stamp>[-n]` beside `path`: where an unusable file is kept."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
    while os.path.lexists(dest):  # two moves within a second: never clobber an earlier one
        n += 1
        dest = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    return dest


def move_aside(path: Path, why: str, what: str, category: type[Warning]) -> Path:
    """Rename an unusable file out of the way (under its writer's lock) before a new one replaces it, with one
    warning naming both; RuntimeError when it cannot be moved (then nothing may overwrite it). `what` names the
    file for the messages ("tuning DB", "oasr.autotune: cache")."""
    dest = aside_path(path)
    try:
        os.rename(path, dest)
    except OSError as e:
        raise RuntimeError(f"{what} {path} is unusable ({why}) and could not be moved aside to {dest} "
                           f"({e.strerror or e}); refusing to replace it: move or repair it by hand") from None
    warnings.warn(f"{what} {path}: existing file unusable ({why}); moved aside to {dest}; writing a new file",
                  category, stacklevel=3)
    return dest
