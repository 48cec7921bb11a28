"""The JIT cache is trusted only as far as it can be: safe directories, verified libraries, no orphaned nvcc,
no silently truncated sizes (issue 12, "JIT cache (security)").

Most tests build with a fake `nvcc` (a script the test writes) that copies a tiny real shared library compiled
with gcc: it exports the oasr C ABI, so the whole build -> install -> verify -> dlopen path runs on a CPU box.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from filelock import FileLock

from oasr_ops.codegen import jit
from oasr_ops.codegen.jit import BuildError, JitSpec, LoadError, UnsafeCacheError
from oasr_ops.runtime.registry import get_lane
from oasr_ops.codegen.render import ABI_VERSION
from oasr_ops.configs import parse

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not sys.platform.startswith("linux"),
                                reason="needs gcc and Linux")

FAKE_LIB_C = r"""
#include <stddef.h>
#include <stdio.h>
#ifndef ABI
#define ABI 1
#endif
#ifdef MARKER
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("constructor ran", f); fclose(f); }
}
#endif
int oasr_abi_version(void) { return ABI; }
const char *oasr_describe(void) { return "fake|fp16|test|"; }
int oasr_run(void *a, void *w, void *b, void *o, int m, int n, int k, int s, int act, void *ws, size_t wsb,
             void *st) { return m + n + k + s + act; }
int oasr_can_implement(int m, int n, int k, int s, int act) { return m - n; }
size_t oasr_workspace_size(int m, int n, int k, int s, int act) { return (size_t)k; }
int oasr_bmm_abi_version(void) { return 3; }
int oasr_bmm_run(void *a, void *b, void *o, int l, int m, long long lda, void *ws, size_t wsb, void *st) {
    return l + m + (int)(lda >> 32);
}
int oasr_bmm_can_implement(int l, int m, long long lda) { return 0; }
size_t oasr_bmm_workspace_size(int l, int m, long long lda) { return 0; }
"""

FAKE_NVCC = """#!{python}
import os, subprocess, sys, time
out = sys.argv[sys.argv.index("-o") + 1]
with open({count!r}, "a") as f:
    f.write("nvcc\\n")
mode = open({mode!r}).read().strip()
if mode == "ok":
    subprocess.check_call(["cp", {lib!r}, out])
elif mode == "badabi":
    subprocess.check_call(["cp", {badabi!r}, out])
elif mode == "garbage":
    open(out, "wb").write(b"this is not an ELF file" * 100)
elif mode == "hang":
    child = subprocess.Popen(["sleep", "300"])
    with open({pids!r} + ".tmp", "w") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}\\n")
    os.replace({pids!r} + ".tmp", {pids!r})
    time.sleep(300)
else:
    sys.exit(3)
"""


def _gcc(src: Path, out: Path, *defines: str) -> Path:
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", *defines, str(src), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fakelibs")
    src = d / "fake.c"
    src.write_text(FAKE_LIB_C)
    marker = d / "planted-constructor-ran"
    return {
        "ok": _gcc(src, d / "ok.so", f"-DABI={ABI_VERSION}"),
        "badabi": _gcc(src, d / "badabi.so", f"-DABI={ABI_VERSION + 100}"),
        "planted": _gcc(src, d / "planted.so", f"-DABI={ABI_VERSION}", f'-DMARKER="{marker}"'),
        "marker": marker,
    }


class FakeNvcc:
    def __init__(self, root: Path, libs: dict):
        self.root = root
        self.mode_file, self.count_file, self.pids = root / "mode", root / "count", root / "pids"
        self.path = root / "nvcc"
        self.path.write_text(FAKE_NVCC.format(python=sys.executable, count=str(self.count_file),
                                              mode=str(self.mode_file), lib=str(libs["ok"]),
                                              badabi=str(libs["badabi"]), pids=str(self.pids)))
        self.path.chmod(0o755)
        self.set("ok")

    def set(self, mode: str) -> None:
        self.mode_file.write_text(mode)

    @property
    def runs(self) -> int:
        return len(self.count_file.read_text().split()) if self.count_file.exists() else 0


@pytest.fixture
def env(tmp_path, monkeypatch, libs):
    """A private JIT dir (not yet created) and a fake nvcc; yields (spec, fake nvcc, jit dir)."""
    jdir = tmp_path / "cache" / "jit"
    monkeypatch.setenv("OASR_JIT_DIR", str(jdir))
    tools = tmp_path / "tools"
    tools.mkdir()
    fake = FakeNvcc(tools, libs)
    monkeypatch.setattr(jit, "nvcc_path", lambda: str(fake.path))
    spec = JitSpec(get_lane("sm80_f16_mma"), parse("b64x64x64_w32x32x64_s3"), "fp16", "80")
    return spec, fake, jdir


def _mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


# ---------------------------------------------------------------------------------------------------------
# 1. directories

def test_build_creates_private_dirs_and_a_manifest(env):
    spec, fake, jdir = env
    path = spec.build()
    assert path == spec.so_path and fake.runs == 1
    for d in (jdir, jdir.parent, jdir / "logs"):
        assert _mode(d) == 0o700, d
    man = jit.manifest_path(path)
    assert _mode(man) == 0o600
    assert man.read_text().split() == [hashlib.sha256(path.read_bytes()).hexdigest(), path.name]
    assert spec.is_built()
    lib = spec.load()
    assert lib.describe.startswith("fake|") and lib.run(None, None, None, None, 1, 2, 3, 4, 5, None, 0, None) == 15
    assert spec.build() == path and fake.runs == 1  # verified: reused
    assert not list(jdir.glob(".*.build-*"))  # temp build dir removed


@pytest.mark.parametrize("where", ["jit", "logs"])
@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_refuses_a_directory_others_can_write(env, where, mode):
    spec, fake, jdir = env
    (jdir / "logs").mkdir(parents=True)
    bad = jdir if where == "jit" else jdir / "logs"
    bad.chmod(mode)
    with pytest.raises(UnsafeCacheError) as ei:
        spec.build()
    msg = str(ei.value)
    assert str(bad) in msg and "writable by" in msg and f"chmod 700 {bad}" in msg and "OASR_JIT_DIR" in msg
    assert fake.runs == 0 and not spec.so_path.exists()
    if where == "jit":
        assert not spec.is_built()
        with pytest.raises(BuildError):  # the ops catch BuildError / LoadError and fall back
            spec.load()
    bad.chmod(0o700)  # the documented way out
    spec.build()
    assert spec.is_built() and fake.runs == 1


def test_refuses_a_directory_owned_by_someone_else(env, monkeypatch):
    spec, fake, jdir = env
    spec.build()
    if os.getuid() == 0:
        os.chown(jdir, 65534, -1)
    else:
        monkeypatch.setattr(jit.os, "getuid", lambda: os.geteuid() + 4242)
    assert not spec.is_built()
    with pytest.raises(UnsafeCacheError, match=re.escape(str(jdir)) + ".*owned by uid"):
        spec.load()
    with pytest.raises(UnsafeCacheError):
        spec.build()


def test_a_jit_dir_that_is_a_file_is_named_without_a_chmod_hint(env, tmp_path, monkeypatch):
    spec, fake, _jdir = env
    f = tmp_path / "a-file"
    f.write_text("")
    monkeypatch.setenv("OASR_JIT_DIR", str(f))
    with pytest.raises(UnsafeCacheError, match="is not a directory; set OASR_JIT_DIR") as ei:
        spec.load()
    assert "chmod" not in str(ei.value) and fake.runs == 0


def test_a_cache_it_cannot_write_is_a_build_error(env, monkeypatch):
    """A read-only or full cache fails at the per-kernel lock file before nvcc runs: a BuildError (which the ops
    catch to fall back, build_many reports per kernel and KernelCache remembers), not a raw OSError. (As root a
    chmod cannot deny the lock, so the lock itself raises what a read-only directory gives.)"""
    spec, fake, jdir = env

    class ReadOnlyLock:
        def __init__(self, path):
            self.path = path

        def __enter__(self):
            raise PermissionError(13, "Permission denied", self.path)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(jit, "FileLock", ReadOnlyLock)
    with pytest.raises(BuildError, match="cannot build .*Permission denied"):
        spec.build()
    with pytest.raises(BuildError):
        spec.load()
    report = jit.build_many([spec], jobs=1, progress=False)
    assert report.failed and fake.runs == 0


# ---------------------------------------------------------------------------------------------------------
# 2. verify before dlopen

def test_planted_library_is_never_executed(env, libs):
    spec, fake, jdir = env
    marker = libs["marker"]
    marker.unlink(missing_ok=True)
    jdir.mkdir(parents=True, mode=0o700)
    shutil.copy(libs["planted"], spec.so_path)  # a library at the key path with no manifest
    assert not spec.is_built()
    with pytest.MonkeyPatch.context() as mp, pytest.raises(BuildError, match="nvcc not found"):
        mp.setattr(jit, "nvcc_path", lambda: None)  # no toolchain: refuse it, never load it
        spec.load()
    assert not marker.exists()
    with pytest.warns(RuntimeWarning, match=re.escape(str(spec.so_path)) + ".*no install manifest"):
        lib = spec.load()  # rebuilt, then loaded
    assert fake.runs == 1 and lib.describe.startswith("fake|")
    assert not marker.exists()
    # control: the planted library does run its constructor when dlopen'ed
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(libs['planted'])!r})"], check=True)
    assert marker.exists()
    marker.unlink()


def test_library_with_a_foreign_manifest_is_never_executed(env, libs):
    spec, fake, jdir = env
    marker = libs["marker"]
    marker.unlink(missing_ok=True)
    spec.build()
    shutil.copy(libs["planted"], spec.so_path)  # swapped after install: the manifest names the old hash
    assert not spec.is_built()
    with pytest.warns(RuntimeWarning, match="does not match its install manifest"):
        spec.load()
    assert not marker.exists() and fake.runs == 2
    # A library writable by others is not trusted even with a matching manifest.
    spec.so_path.chmod(0o666)
    assert not spec.is_built()


# ---------------------------------------------------------------------------------------------------------
# 3. corrupt libraries: detect, rebuild once, report, then raise

def test_zero_byte_library_is_rebuilt_once(env):
    spec, fake, jdir = env
    jdir.mkdir(parents=True, mode=0o700)
    spec.so_path.write_bytes(b"")
    with pytest.warns(RuntimeWarning, match=re.escape(str(spec.so_path))):
        lib = spec.load()
    assert fake.runs == 1 and lib.can_implement(7, 5, 1, 1, 0) == 2


def test_unloadable_library_is_rebuilt_once_then_load_error(env):
    spec, fake, jdir = env
    fake.set("garbage")  # nvcc "succeeds" but writes a file dlopen rejects
    with pytest.raises(LoadError, match="freshly built"):
        spec.load()  # a fresh build that does not load: no second build
    assert fake.runs == 1
    # a verified library from an earlier build that does not load: rebuilt once, then the error
    with pytest.warns(RuntimeWarning, match=re.escape(str(spec.so_path)) + ".*rebuilding it once"):
        with pytest.raises(LoadError, match="freshly built"):
            spec.load()
    assert fake.runs == 2


def test_verified_library_that_fails_to_load_is_replaced(env):
    spec, fake, jdir = env
    fake.set("garbage")
    spec.build()
    fake.set("ok")
    with pytest.warns(RuntimeWarning, match="rebuilding it once"):
        lib = spec.load()
    assert fake.runs == 2 and lib.describe.startswith("fake|")


def test_wrong_abi_is_rebuilt_once_then_load_error(env):
    spec, fake, jdir = env
    fake.set("badabi")
    spec.build()
    with pytest.warns(RuntimeWarning, match="launcher ABI"):
        with pytest.raises(LoadError, match="launcher ABI"):
            spec.load()
    assert fake.runs == 2
    fake.set("ok")  # the bad handle was closed: the rebuilt library at the same path really loads
    with pytest.warns(RuntimeWarning, match="launcher ABI"):
        assert spec.load().describe.startswith("fake|")
    assert fake.runs == 3


def test_failed_rebuild_raises_build_error(env):
    spec, fake, jdir = env
    fake.set("garbage")
    spec.build()
    fake.set("fail")
    with pytest.warns(RuntimeWarning, match="rebuilding it once"):
        with pytest.raises(BuildError, match="nvcc failed"):
            spec.load()
    assert fake.runs == 2


def test_corrupted_after_install_is_rebuilt(env):
    spec, fake, jdir = env
    path = spec.build()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not spec.is_built()
    with pytest.warns(RuntimeWarning, match=re.escape(str(path)) + ".*does not match its install manifest"):
        report = jit.build_many([spec], jobs=1, progress=False)
    assert report.built == [spec.name] and fake.runs == 2 and spec.is_built()


# ---------------------------------------------------------------------------------------------------------
# 4. a SIGKILLed builder leaves nothing running; its temp dir goes at the next build

def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie waits for a reaper that is not ours


def _session_members(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                out.append(int(d.name))
    return out


def _leads_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except OSError:  # exited meanwhile
        return False


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(d.name))
    return kids


def _wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


BUILDER = """
import sys
from oasr_ops.codegen import jit
from oasr_ops.codegen.jit import JitSpec
from oasr_ops.runtime.registry import get_lane
from oasr_ops.configs import parse
if sys.argv[1] != "real":
    jit.nvcc_path = lambda: sys.argv[1]
JitSpec(get_lane("sm80_f16_mma"), parse("b64x64x64_w32x32x64_s3"), "fp16", "80").build()
"""


def _start_builder(nvcc: str, jdir: Path) -> subprocess.Popen:
    repo = Path(jit.__file__).resolve().parents[2]
    return subprocess.Popen([sys.executable, "-c", BUILDER, nvcc], cwd=repo,
                            env={**os.environ, "OASR_JIT_DIR": str(jdir), "PYTHONPATH": str(repo)})


def test_sigkilled_builder_leaves_no_process_and_its_temp_dir_is_swept(env):
    spec, fake, jdir = env
    fake.set("hang")
    builder = _start_builder(str(fake.path), jdir)
    try:
        assert _wait(fake.pids.exists, 60), "the fake nvcc never started"
        nvcc_pid, grandchild = map(int, fake.pids.read_text().split())
        guards = _children(builder.pid)
        assert len(guards) == 1 and os.getsid(guards[0]) == guards[0]  # nvcc runs in its own session
        assert os.getsid(nvcc_pid) == guards[0] != os.getsid(builder.pid)
    finally:
        builder.send_signal(signal.SIGKILL)
        builder.wait()
    assert _wait(lambda: not _alive(nvcc_pid) and not _alive(grandchild), 10), "nvcc outlived its builder"
    assert _session_members(guards[0]) == []
    stale = list(jdir.glob(f".*.build-{builder.pid}-*"))  # (its key may differ: nvcc_version() is per process)
    assert len(stale) == 1 and stale[0].is_dir()
    # A live build of another kernel keeps its temp dir: its lock is held.
    busy_stem = "other_kernel-0123456789abcdef0123"
    busy = jdir / f".{busy_stem}.build-1-xyz"
    busy.mkdir()
    dead = jdir / ".dead_kernel-00000000000000000000.build-999999-abc"
    dead.mkdir()
    fake.set("ok")
    lock = FileLock(str(jdir / f"{busy_stem}.so.lock"))
    with lock:
        spec.build()
    assert not stale[0].exists() and not dead.exists() and busy.exists()
    assert spec.is_built()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_sigkilled_real_nvcc_build_leaves_no_process(tmp_path):
    jdir = tmp_path / "jit"
    builder = _start_builder("real", jdir)
    try:
        seen: list[int] = []

        def guard_started() -> bool:
            # The nvcc guard is the builder's one child that leads its own session. Not just "one child": the
            # builder first runs `nvcc --version` (the cache key's nvcc validator) as a plain child, and on a
            # loaded machine that one lives long enough to be seen; its pid names no session, so the wait below
            # then timed out ("never started compiling"). Keep the pid that was seen: a second listing can race
            # with the child's exec.
            seen[:] = [pid for pid in _children(builder.pid) if _leads_session(pid)]
            return len(seen) == 1
        assert _wait(guard_started, 60)
        sid = seen[0]

        def compiling() -> bool:  # nvcc has handed over to its front end / back end
            names = set()
            for pid in _session_members(sid):
                try:
                    names.add(Path(f"/proc/{pid}/comm").read_text().strip())
                except OSError:
                    pass
            return bool(names & {"cudafe++", "cicc", "gcc", "cc1plus", "ptxas"})

        assert _wait(compiling, 120), "nvcc never started compiling"
    finally:
        builder.send_signal(signal.SIGKILL)
        builder.wait()
    assert _wait(lambda: _session_members(sid) == [], 15), f"left running: {_session_members(sid)}"


# ---------------------------------------------------------------------------------------------------------
# 5. integer arguments are range-checked, not truncated

@pytest.mark.parametrize("bad", [2**31, -2**31 - 1, 2**32 + 5, 2**70])
def test_int32_arguments_out_of_range_raise(env, bad):
    spec, fake, jdir = env
    lib = spec.load()
    with pytest.raises(ValueError, match=rf"oasr_can_implement: argument m = {bad} .*32-bit"):
        lib.can_implement(bad, 1, 1, 1, 0)
    with pytest.raises(ValueError, match=rf"argument k = {bad}"):
        lib.workspace_size(1, 1, bad, 1, 0)
    with pytest.raises(ValueError, match=rf"oasr_run: argument n = {bad}"):
        lib.run(None, None, None, None, 1, bad, 1, 1, 0, None, 0, None)
    with pytest.raises(ValueError, match="workspace_bytes = -1"):
        lib.run(None, None, None, None, 1, 1, 1, 1, 0, None, -1, None)
    # the limits themselves pass through unchanged
    assert lib.can_implement(2**31 - 1, 0, 1, 1, 0) == 2**31 - 1
    assert lib.can_implement(-2**31, 0, 1, 1, 0) == -2**31
    assert lib.workspace_size(1, 1, 2**31 - 1, 1, 0) == 2**31 - 1


def test_launcher_arguments_are_range_checked(env):
    spec, fake, jdir = env
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    shape = [i, i, ll]
    lib = jit.load_launcher(spec, "bmm", 3, [p, p, p, *shape, p, ctypes.c_size_t, p], shape,
                            run_names=["a", "b", "out", "L", "M", "lda", "ws", "ws_bytes", "stream"])
    assert lib.run(None, None, None, 2, 3, 5 << 32, None, 0, None) == 10  # 64-bit stride passed whole
    with pytest.raises(ValueError, match=r"oasr_bmm_run: argument M = 2147483648"):
        lib.run(None, None, None, 2, 2**31, 0, None, 0, None)
    with pytest.raises(ValueError, match=r"argument lda = .*64-bit"):
        lib.run(None, None, None, 2, 3, 2**63, None, 0, None)
    with pytest.raises(ValueError, match=r"oasr_bmm_can_implement: argument #0 = 4294967296"):
        lib.can_implement(2**32, 1, 1)  # unnamed: by position
    with pytest.raises(TypeError, match="must be an integer"):
        lib.can_implement(1.5, 1, 1)
    with pytest.raises(LoadError, match="bmm launcher ABI 3, expected 4"):
        jit.load_launcher(spec, "bmm", 4, [p], [i])


def test_checked_passes_through_non_integer_signatures():
    libc = ctypes.CDLL(None)
    fn = jit.checked(libc.strlen, [ctypes.c_char_p], ctypes.c_size_t)
    assert fn is libc.strlen and fn(b"abc") == 3
    labs = jit.checked(libc.labs, [ctypes.c_long], ctypes.c_long, ["x"])
    assert labs(-2**62) == 2**62
    with pytest.raises(ValueError, match="argument x"):
        labs(2**63)


if __name__ == "__main__":  # per-call overhead of the range check (a number for the notes, never asserted)
    import tempfile
    import timeit

    d = Path(tempfile.mkdtemp())
    (d / "f.c").write_text(FAKE_LIB_C)
    so = _gcc(d / "f.c", d / "f.so", f"-DABI={ABI_VERSION}")
    i, p = ctypes.c_int, ctypes.c_void_p
    types = [p] * 4 + [i] * 5 + [p, ctypes.c_size_t, p]
    raw = ctypes.CDLL(str(so)).oasr_run
    raw.argtypes, raw.restype = types, i
    wrapped = jit.checked(ctypes.CDLL(str(so)).oasr_run, types, i)
    args = (1, 2, 3, 4, 4096, 4096, 4096, 1, 0, None, 0, 5)
    best = {"raw": 1.0, "checked": 1.0}
    for _ in range(40):  # interleaved, best of 40: the CPU box is shared with background nvcc builds
        for n, f in (("raw", raw), ("checked", wrapped)):
            best[n] = min(best[n], timeit.timeit(lambda f=f: f(*args), number=50_000) / 50_000)
    print(f"oasr_run through ctypes: raw {best['raw'] * 1e9:.0f} ns, checked {best['checked'] * 1e9:.0f} ns, "
          f"overhead {(best['checked'] - best['raw']) * 1e9:.0f} ns/call")
