"""The JIT cache's trust rules: who may write the cache, what a built library must hash to before it is loaded,
nvcc in a process group that dies with its builder, and stale build directories swept.

Contract (each raises only what it says): `_check_dir` / `_secure_dir` raise UnsafeCacheError (a BuildError);
`_verify` never raises (returns why a file is not trusted, or None); `_install` renames a built library into place
and writes its manifest atomically (OSError from the filesystem); `_run_nvcc` returns (rc, stdout, stderr);
`_sweep_stale_builds` never raises.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

from filelock import FileLock


class BuildError(RuntimeError):
    def __init__(self, message: str, log_path: Path | None = None):
        super().__init__(message if log_path is None else f"{message} (nvcc log: {log_path})")
        self.log_path = log_path


class LoadError(RuntimeError):
    pass


class UnsafeCacheError(BuildError):
    """The JIT directory could be written by someone else: nothing in it is built or loaded."""



# ----------------------------------------------------------------------------------------------------------
# cache trust: directory checks, install manifests

def _check_dir(d: Path) -> None:
    """Raise UnsafeCacheError unless `d` is a directory owned by this user and writable by no one else."""
    try:
        st = d.stat()
    except OSError as e:
        raise UnsafeCacheError(f"cannot use JIT cache directory {d}: {e}") from None
    if not stat.S_ISDIR(st.st_mode):  # no permission fix applies: say only that
        raise UnsafeCacheError(f"cannot use JIT cache directory {d}: it is not a directory; set OASR_JIT_DIR to a "
                               "directory only you can write")
    problems = []
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


