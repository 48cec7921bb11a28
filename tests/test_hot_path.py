"""The C++ hot path on the CPU (families/hot_path.py, templates/hot_path.cpp, codegen/host_ext.py): `oasr::gemm`,
and (the second script) the int8 and fp8 GEMMs, the depthwise conv and layer_norm_quant.

The extension is really built (the host compiler against the installed torch, into a JIT directory of the test's
own) and served at the CPU key, as the GPU serves it at CUDA: its backend and Autograd kernels replace the Python
ones, and kernel plans launch a recording stub library through the launcher's function pointer (the GPU suite,
tests/test_hot_path_gpu.py, runs the real kernels). Checked: a hit gives the answer the Python path gave (same
launcher arguments, same output; the torch arms bit for bit), bad calls still get the Python path's errors,
fallbacks and warnings, plans are forgotten with the Python ones, counts reach `served()`, `disable()` gives the
op back, and a build failure is a BuildError naming the log. In a subprocess: the stubs replace module globals
and the hot path changes the process's dispatch table.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RECORDING_STUB = r'''
#include <stddef.h>
#include <stdint.h>
static long long last[9];
static int calls;
int oasr_abi_version(void) { return %(abi)d; }
const char* oasr_describe(void) { return "recording stub"; }
int oasr_can_implement(int M, int N, int K, int split, int act) { return 0; }
size_t oasr_workspace_size(int M, int N, int K, int split, int act) { return 256; }
int oasr_run(const void* a, const void* w, const void* bias, void* d, int M, int N, int K, int split, int act,
             void* ws, size_t ws_bytes, void* stream) {
  uint16_t* out = (uint16_t*)d;
  for (long long i = 0; i < (long long)M * N; ++i) out[i] = (uint16_t)(0x3C00 + (i %% 7));  /* 1.0, 1.0009765625, ... */
  long long v[9] = {M, N, K, split, act, (long long)ws_bytes, ws != 0, bias != 0, (long long)(intptr_t)stream};
  for (int i = 0; i < 9; ++i) last[i] = v[i];
  return ++calls, 0;
}
long long rec_last(int i) { return last[i]; }
int rec_calls(void) { return calls; }
'''

SCRIPT = r'''
import ctypes, subprocess, sys, tempfile, warnings
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
import host_overhead as H
from oasr_ops.codegen.templates import ABI_VERSION

tmp = Path(tempfile.mkdtemp())
(tmp / "rec.c").write_text(STUB % {"abi": ABI_VERSION})
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(tmp / "rec.so"), str(tmp / "rec.c")], check=True)
H._install_stubs(tmp / "rec.so")
rec = ctypes.CDLL(str(tmp / "rec.so"))
rec.rec_last.restype = ctypes.c_longlong
last = lambda: [rec.rec_last(i) for i in range(9)]

import oasr_ops
from oasr_ops.families import hot_path as hp
from oasr_ops.families.gemm import ops as G
from oasr_ops.runtime import database
from oasr_ops.runtime.registry import native_lane

kernel = native_lane("sm90", "gemm").default.id
gemm = torch.ops.oasr.gemm.default
torch.manual_seed(0)
a, w, b = torch.randn(2, 9, 64).half(), torch.randn(96, 64).half(), torch.randn(96).half()
calls = lambda: sum(p.calls for p in G.served())

hp.enable("CPU")
hp.enable("CPU")  # idempotent
try:
    hp.enable("CUDA")
    raise AssertionError("a second backend was accepted")
except RuntimeError as e:
    assert "already serving" in str(e)

with torch.no_grad():
    # a kernel plan: the first call is Python's (it installs the plan), the second C++'s, same launch
    y1 = gemm(a, w, b, "silu", kernel)
    n1, l1 = rec.rec_calls(), last()
    assert torch.ops.oasr_hot.size() == 1
    y2 = gemm(a, w, b, "silu", kernel)
    assert rec.rec_calls() == n1 + 1 and last() == l1, (last(), l1)
    assert l1 == [18, 96, 64, 1, 3, 256, 1, 1, 0], l1  # M N K split act ws_bytes ws? bias? stream
    assert y2.shape == (2, 9, 96) and torch.equal(y1, y2)
    assert y2[0, 0, 1].item() == 1.0009765625  # written by the stub, not left over
    assert calls() == 2

    # torch arms, every activation, with and without bias: the hit equals the miss bit for bit
    for cfg in ("torch", "fused"):
        for act in ("none", "relu", "gelu", "silu"):
            for bias in (None, b):
                first = gemm(a, w, bias, act, cfg)
                second = gemm(a, w, bias, act, cfg)
                assert torch.equal(first, second), (cfg, act)
                ref = G.reference_gemm(a, w, bias, act)
                assert (first.float() - ref.float()).abs().max().item() < 2e-2, (cfg, act)
    assert calls() == 2 + 2 * 16

    # other ranks on those plans (the key holds M, not the rank): a 2-D operand takes addmm / mm directly, the same
    # bits as the 3-D one; a 4-D operand takes at::linear (which adds a bias separately, as F.linear does there)
    hp.collect_calls()
    for act in ("none", "silu"):
        for bias in (None, b):
            y3 = gemm(a, w, bias, act, "torch")
            assert torch.equal(gemm(a.view(18, 64), w, bias, act, "torch"), y3.view(18, 96)), (act, bias is None)
            y4 = gemm(a.view(2, 3, 3, 64), w, bias, act, "torch")
            assert y4.shape == (2, 3, 3, 96)
            assert (y4.float() - y3.view(2, 3, 3, 96).float()).abs().max().item() < 2e-2, (act, bias is None)
    assert sum(torch.ops.oasr_hot.drain_calls()[1::2]) == 12  # every one answered in C++

with torch.inference_mode():  # no autograd keys: the backend kernel (C++) directly, hits counted there too
    hp.collect_calls()
    yi = gemm(a, w, b, "silu", kernel)
    assert torch.equal(yi, y1) and sum(torch.ops.oasr_hot.drain_calls()[1::2]) == 1
with torch.no_grad():
    size = torch.ops.oasr_hot.size()
    assert size == 1 + 16, size

    # bad calls after the plan exists: the Python path's errors
    bad = [((a.float(), w, b, "silu", kernel), "dtype"), ((a, w, b[:5].contiguous(), "silu", kernel), "bias"),
           ((a, w, b.float(), "silu", kernel), "bias"), ((a, w.t().contiguous().t(), b, "silu", kernel), "contiguous"),
           ((a, w, b, "tanh", kernel), "activation"), ((a, w[:, :32].contiguous(), b, "silu", kernel), "K mismatch"),
           ((a, w, b, "silu", "not_a_config"), "config")]
    for args, word in bad:
        try:
            gemm(*args)
            raise AssertionError(f"accepted: {word}")
        except ValueError as e:
            assert word in str(e), (word, str(e))

    # a misaligned operand: Python serves it with torch and warns once; the stub is not called
    buf = torch.randn(18 * 64 + 1).half()
    shifted = buf[1:].view(2, 9, 64)
    n0 = rec.rec_calls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = gemm(shifted, w, b, "silu", kernel)
    assert rec.rec_calls() == n0 and any("aligned" in str(x.message) for x in seen)
    assert (y.float() - G.reference_gemm(shifted, w, b, "silu").float()).abs().max().item() < 2e-2

    # plans are forgotten with the Python ones, and come back on the next call
    G.reset_plans()
    assert torch.ops.oasr_hot.size() == 0
    gemm(a, w, b, "silu", kernel)
    assert torch.ops.oasr_hot.size() == 1
    database.reload()
    assert torch.ops.oasr_hot.size() == 0
    gemm(a, w, b, "silu", kernel)
    gemm(a, w, b, "silu", kernel)
    # reset_plans dropped the earlier plans; the one made before the reload served 1 call, this epoch's 2
    assert sorted(p.calls for p in G.served()) == [1, 2], [p.calls for p in G.served()]

# threads: hits, misses and installs racing plans being forgotten (reset_plans, DB reloads) — every answer right
import threading
errors = []

def worker(seed):
    g = torch.Generator().manual_seed(seed)
    for i in range(150):
        x = torch.randn(1 + i % 5, 64, generator=g).half()
        cfg = ("torch", "fused", kernel)[i % 3]
        try:
            with torch.no_grad():
                y = gemm(x, w, b, "relu", cfg)
            assert y.shape == (x.shape[0], 96)
            if cfg != kernel:  # the stub kernel computes nothing to compare
                assert (y.float() - G.reference_gemm(x, w, b, "relu").float()).abs().max().item() < 2e-2
        except Exception as e:  # noqa: BLE001 - collected, asserted below
            errors.append(repr(e))

def forgetter():
    for i in range(40):
        G.reset_plans() if i % 2 else database.reload()

threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)] + [threading.Thread(target=forgetter)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors[:3]

# grad mode: the forward runs (C++'s autograd Function), the backward raises
wg = w.clone().requires_grad_()
y = gemm(a, wg, b, "none", "torch")
assert y.requires_grad
try:
    y.float().sum().backward()
    raise AssertionError("backward ran")
except RuntimeError as e:
    assert "no backward" in str(e)

# disable: the Python kernels are back (the CPU reference; no plan, no stub call, nothing installed)
with torch.no_grad():
    gemm(a, w, b, "silu", kernel)  # (re)installs the plan the threads' forgetting may have dropped
hp.disable()
n0, size0 = rec.rec_calls(), torch.ops.oasr_hot.size()
with torch.no_grad():
    y = gemm(a, w, b, "silu", kernel)
assert rec.rec_calls() == n0 and torch.ops.oasr_hot.size() == size0
assert torch.equal(y, G.reference_gemm(a, w, b, "silu"))
hp.enable("CPU")
hp.collect_calls()
with torch.no_grad():
    gemm(a, w, b, "silu", kernel)  # the table kept its plan while off: answered in C++ (counted there)
answered = torch.ops.oasr_hot.drain_calls()
assert rec.rec_calls() == n0 + 1 and sum(answered[1::2]) == 1, answered
hp.disable()
print("OK")
'''


@pytest.mark.slow
def test_cpp_hot_path_on_cpu(hot_path_jit):
    env = {**os.environ, "OASR_JIT_DIR": str(hot_path_jit), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", f"STUB = {RECORDING_STUB!r}\n" + SCRIPT], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-3000:] + r.stderr[-5000:]


COMPILE_SCRIPT = r'''
import torch
import oasr_ops
from oasr_ops.families import hot_path
from oasr_ops.inductor import backend as be

be._any_cuda = lambda inputs: True  # as for CUDA inputs: the backend switches the hot path on while it compiles
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
x = torch.randn(4, 32)
compiled = torch.compile(model, backend="oasr", dynamic=True)
with torch.no_grad():
    y = compiled(x)
    torch.testing.assert_close(y, model(x))
assert hot_path.enabled() == "CUDA", hot_path.enabled()
assert torch.ops.oasr_hot.size() == 0  # nothing ran on CUDA
print("OK")
'''


@pytest.mark.slow
def test_backend_switches_the_hot_path_on_inside_a_real_compile(tmp_path):
    """The backend enables the hot path from inside Dynamo's compile (a real torch.compile, the real build from an
    empty JIT directory: the only test that leaves the build to `enable`, the others start from `hot_path_jit`'s
    copy): no tracing mode sees the registration, the compiled model still computes the model."""
    env = {**os.environ, "OASR_JIT_DIR": str(tmp_path / "jit"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-3000:] + r.stderr[-5000:]


def test_build_failure_is_a_build_error(tmp_path, monkeypatch):
    """No compiler: a BuildError saying so; a compiler that fails: a BuildError naming its log, which holds the
    command; nothing is installed either way."""
    from oasr_ops.codegen import host_ext
    from oasr_ops.codegen.cache_trust import BuildError

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path / "jit"))
    host_ext.cxx_path.cache_clear()
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    try:
        with pytest.raises(BuildError, match="C\\+\\+ compiler not found"):
            host_ext.HostExtension().build()
        failing = tmp_path / "failing-cxx"
        failing.write_text("#!/bin/sh\necho 'simulated compiler error' >&2\nexit 1\n")
        failing.chmod(0o755)
        monkeypatch.setenv("CXX", str(failing))
        host_ext.cxx_path.cache_clear()
        host_ext.cxx_version.cache_clear()
        ext = host_ext.HostExtension()
        with pytest.raises(BuildError, match="compiler failed") as info:
            ext.build()
        assert "simulated compiler error" in ext.log_path.read_text()
        assert str(ext.log_path) in str(info.value)
        assert not ext.is_built()
    finally:
        host_ext.cxx_path.cache_clear()
        host_ext.cxx_version.cache_clear()


def test_load_refuses_a_directory_others_can_write(tmp_path, monkeypatch):
    """A verified hot-path library in a directory others can write is never dlopened (UnsafeCacheError, a
    BuildError the backend's fallback catches), as the kernels' loader refuses: the check-then-load race."""
    import hashlib

    import torch

    from oasr_ops.codegen import host_ext
    from oasr_ops.codegen.cache_trust import UnsafeCacheError, manifest_path

    jdir = tmp_path / "jit"
    jdir.mkdir(mode=0o700)
    monkeypatch.setenv("OASR_JIT_DIR", str(jdir))
    monkeypatch.setattr(host_ext, "_loaded_path", None)
    ext = host_ext.HostExtension()
    so = ext.so_path
    so.parent.mkdir(parents=True, exist_ok=True)
    so.write_bytes(b"not really a library")
    manifest_path(so).write_text(f"{hashlib.sha256(so.read_bytes()).hexdigest()} {so.name}\n")
    opened = []
    monkeypatch.setattr(torch.ops, "load_library", lambda p: opened.append(p))
    so.parent.chmod(0o777)
    try:
        with pytest.raises(UnsafeCacheError, match="writable by"):
            ext.load()
    finally:
        so.parent.chmod(0o700)
    assert opened == []


def test_enable_from_env_without_cuda_keeps_python(monkeypatch):
    """OASR_CPP_HOT_PATH=1 on a machine without CUDA: nothing changes (the hot path serves CUDA only)."""
    from oasr_ops.families import hot_path

    monkeypatch.setenv(hot_path.ENV, "1")
    hot_path.enable_from_env()
    assert hot_path.enabled() is None


# The int8 GEMMs' and the depthwise conv's launchers, recording their arguments (pointers as integers, alpha's bits)
# and writing `rec_elt` bytes per output element with a fixed pattern.
RECORDING_FAMILY_STUB = r'''
#include <stddef.h>
#include <stdint.h>
#include <string.h>
static long long smm[17], dw[15], lnq[10];
static int smm_calls, dw_calls, lnq_calls, elt = 2;
int oasr_abi_version(void) { return %(abi)d; }
const char* oasr_describe(void) { return "recording family stub"; }
int oasr_run(void) { return 0; }
int oasr_can_implement(void) { return 0; }
size_t oasr_workspace_size(void) { return 0; }
int oasr_smm_abi_version(void) { return %(smm)d; }
int oasr_smmr_abi_version(void) { return %(smmr)d; }
int oasr_dwconv_abi_version(void) { return %(dwconv)d; }
int oasr_lnq_abi_version(void) { return %(lnq)d; }
int oasr_lnq_can_implement(int M, int N) { return 0; }
size_t oasr_lnq_workspace_size(int M, int N) { return 0; }
int oasr_smm_can_implement(int M, int N, int K) { return 0; }
int oasr_smmr_can_implement(int M, int N, int K) { return 0; }
size_t oasr_smm_workspace_size(int M, int N, int K) { return 64; }
size_t oasr_smmr_workspace_size(int M, int N, int K) { return 0; }
int oasr_dwconv_can_implement(int B, int T, int C, int Kw, int act, int glu) { return 0; }
size_t oasr_dwconv_workspace_size(int B, int T, int C, int Kw, int act, int glu) { return 0; }
static void fill(void* out, long long n) {
  unsigned char* o = (unsigned char*)out;
  for (long long i = 0; i < n * elt; ++i) o[i] = (unsigned char)(0x11 + i %% 5);
}
static void record_smm(const void* a, const void* w, const void* sa, int sar, const void* sw, int swc,
                       const void* bias, const void* x, long long x_arg, void* out, int M, int N, int K, void* ws,
                       size_t wsb, void* stream) {
  long long v[17] = {(intptr_t)a, (intptr_t)w, (intptr_t)sa, sar, (intptr_t)sw, swc, (intptr_t)bias, (intptr_t)x,
                     x_arg, M, N, K, ws != 0, (long long)wsb, (intptr_t)stream, (intptr_t)out, 0};
  memcpy(smm, v, sizeof v);
  fill(out, (long long)M * N);
  ++smm_calls;
}
int oasr_smm_run(const void* a, const void* w, const void* sa, int sar, const void* sw, int swc, const void* bias,
                 const void* x, int x_arg, void* out, int M, int N, int K, void* ws, size_t wsb, void* stream) {
  record_smm(a, w, sa, sar, sw, swc, bias, x, x_arg, out, M, N, K, ws, wsb, stream);
  return 0;
}
int oasr_smmr_run(const void* a, const void* w, const void* sa, int sar, const void* sw, int swc, const void* bias,
                  const void* x, float alpha, void* out, int M, int N, int K, void* ws, size_t wsb, void* stream) {
  uint32_t bits;
  memcpy(&bits, &alpha, 4);
  record_smm(a, w, sa, sar, sw, swc, bias, x, bits, out, M, N, K, ws, wsb, stream);
  return 0;
}
int oasr_dwconv_run(const void* x, const void* w, int wf, const void* bias, int bf, void* out, int B, int T, int C,
                    int Kw, int act, int glu, void* ws, size_t wsb, void* stream) {
  long long v[15] = {(intptr_t)x, (intptr_t)w, wf, (intptr_t)bias, bf, B, T, C, Kw, act, glu, ws != 0,
                     (long long)wsb, (intptr_t)stream, (intptr_t)out};
  memcpy(dw, v, sizeof v);
  fill(out, (long long)B * T * C);
  return ++dw_calls, 0;
}
/* layer_norm_quant: N = 24 plays a row the kernel refuses (status 1, nothing launched) */
int oasr_lnq_run(const void* x, const void* w, int wf, const void* b, int bf, void* q, void* scale, void* y, int M,
                 int N, float eps, void* stream) {
  if (N == 24) return 1;
  uint32_t bits;
  memcpy(&bits, &eps, 4);
  long long v[10] = {(intptr_t)x, (intptr_t)w, wf, (intptr_t)b, bf, y != 0, M, N, bits, (intptr_t)stream};
  memcpy(lnq, v, sizeof v);
  unsigned char* o = (unsigned char*)q;
  for (long long i = 0; i < (long long)M * N; ++i) o[i] = (unsigned char)(0x21 + i %% 7);
  float* s = (float*)scale;
  for (int i = 0; i < M; ++i) s[i] = 0.5f + i;
  if (y) {
    uint16_t* h = (uint16_t*)y;
    for (long long i = 0; i < (long long)M * N; ++i) h[i] = (uint16_t)(0x3C00 + i %% 3);
  }
  return ++lnq_calls, 0;
}
long long rec_lnq(int i) { return lnq[i]; }
int rec_lnq_calls(void) { return lnq_calls; }
long long rec_smm(int i) { return smm[i]; }
long long rec_dw(int i) { return dw[i]; }
int rec_smm_calls(void) { return smm_calls; }
int rec_dw_calls(void) { return dw_calls; }
void rec_set_elt(int e) { elt = e; }
'''

FAMILY_SCRIPT = r'''
import ctypes, subprocess, sys, tempfile, warnings
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
import host_overhead as H
from oasr_ops.codegen.templates import ABI_VERSION
from oasr_ops.codegen.variants import SMM_ABI_VERSION, SMMR_ABI_VERSION
from oasr_ops.codegen.render_conv1d import DWCONV_ABI_VERSION
from oasr_ops.codegen.render_layer_norm_quant import LNQ_ABI_VERSION

tmp = Path(tempfile.mkdtemp())
(tmp / "rec.c").write_text(STUB % {"abi": ABI_VERSION, "smm": SMM_ABI_VERSION, "smmr": SMMR_ABI_VERSION,
                                   "dwconv": DWCONV_ABI_VERSION, "lnq": LNQ_ABI_VERSION})
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(tmp / "rec.so"), str(tmp / "rec.c")], check=True)
H._install_stubs(tmp / "rec.so")
rec = ctypes.CDLL(str(tmp / "rec.so"))
rec.rec_smm.restype = rec.rec_dw.restype = rec.rec_lnq.restype = ctypes.c_longlong
smm_args = lambda: [rec.rec_smm(i) for i in range(15)]  # all but the output pointer
dw_args = lambda: [rec.rec_dw(i) for i in range(14)]
lnq_args = lambda: [rec.rec_lnq(i) for i in range(10)]  # all but the output pointers

import oasr_ops
from oasr_ops.families import hot_path as hp
from oasr_ops.families.conv1d import ops as C
from oasr_ops.families.layer_norm_quant import ops as L
from oasr_ops.families.scaled_mm import act_quant, ops as S, residual

ops = torch.ops.oasr
torch.manual_seed(0)
m, n, k = 18, 96, 64
a = torch.randint(-127, 128, (2, 9, k), dtype=torch.int8)
w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
sa, sw = torch.rand(m) + 0.01, torch.rand(n) + 0.01
b16, b32 = torch.randn(n).half(), torch.randn(n)
res = torch.randn(2, 9, n).half()
out_scale = torch.full((1,), 0.05)
tile = S.heuristic_config(m, n, k, "sm90")
hp.enable("CPU")
assert set(hp.served_ops()) == set(hp.OPS)

def hits():
    """Calls the C++ table answered since the last drain (added to their Python plans, as collect_calls does)."""
    pairs = torch.ops.oasr_hot.drain_calls()
    for i in range(0, len(pairs), 2):
        hp._slots[pairs[i]].calls += pairs[i + 1]
    return sum(pairs[1::2])


def twice(fn, *args, elt=2, stub_calls=rec.rec_smm_calls, stub_args=smm_args):
    """The first call (Python, the C++ table emptied first: it installs the plan), then the second (C++): the same
    launch, the same output."""
    rec.rec_set_elt(elt)
    hp.clear()
    y1 = fn(*args)
    c1, l1 = stub_calls(), stub_args()
    h = hits()
    assert h == 0, f"the first call was answered in C++ ({h} hits)"
    y2 = fn(*args)
    assert stub_calls() == c1 + 1, "the second call did not launch"
    h = hits()
    assert h == 1, f"the second call was not answered in C++ ({h} hits)"
    assert stub_args() == l1, (stub_args(), l1)
    for t1, t2 in zip(*((y,) if isinstance(y, torch.Tensor) else y for y in (y1, y2)), strict=True):
        assert torch.equal(t1, t2) and t1.dtype == t2.dtype and t1.shape == t2.shape
    return y1, l1

def python_errors(bad_calls):
    """Each (fn, args, word): the call raises the Python path's ValueError, which names `word`."""
    for fn, args, word in bad_calls:
        try:
            fn(*args)
            raise AssertionError(f"accepted: {word}")
        except ValueError as e:
            assert word in str(e), (word, str(e))

with torch.no_grad():
    # scaled_mm: per-token and per-tensor scales, with and without bias, both out dtypes
    for scale_a, scale_w in ((sa, sw), (sa[:1].clone(), sw[:1].clone())):
        for bias in (None, b16):
            y, l = twice(ops.scaled_mm.default, a, w, scale_a, scale_w, bias, torch.float16, tile)
            assert y.shape == (2, 9, n) and y.dtype == torch.float16
            assert l[3] == int(scale_a.numel() != 1) and l[5] == int(scale_w.numel() != 1)
            assert l[6] == (0 if bias is None else bias.data_ptr()) and l[7] == 0 and l[8] == 0
            assert l[9:14] == [m, n, k, 1, 64], l
    y, _ = twice(ops.scaled_mm.default, a, w, sa, sw, b16.bfloat16(), torch.bfloat16, tile)
    assert y.dtype == torch.bfloat16
    # the quantizing GEMMs: out_scale per tensor and per row
    for scale in (out_scale, torch.rand(m) + 0.01):
        y, l = twice(ops.scaled_mm_quant.default, a, w, sa, sw, b32, scale, tile, elt=1)
        assert y.dtype == torch.int8 and l[7] == scale.data_ptr() and l[8] == int(scale.numel() != 1)
        for act in ("gelu", "silu"):
            y, l = twice(ops.scaled_mm_act_quant.default, a, w, sa, sw, b32, scale, act, tile, elt=1)
            assert y.dtype == torch.int8 and l[7] == scale.data_ptr()
    # the residual GEMM: the residual's pointer and alpha's fp32 bits
    y, l = twice(ops.scaled_mm_residual.default, a, w, sa, sw, b16, res, 0.1, torch.float16, tile)
    import struct
    assert l[7] == res.data_ptr() and l[8] == struct.unpack("I", struct.pack("f", 0.1))[0], l
    # the depthwise conv: both layouts, fp32 and fp16 weights, GLU
    dw = C.native_lane("sm90").default.id
    xb = torch.randn(2, 50, 64).half()
    wf, bf = torch.randn(64, 1, 31), torch.randn(64)
    for x, layout, glu in ((xb, "btc", False), (xb.transpose(1, 2).contiguous(), "bct", False),
                           (torch.randn(2, 50, 128).half(), "btc", True)):
        for wt, bias in ((wf, bf), (wf.half(), None)):
            y, l = twice(ops.conv1d_depthwise.default, x, wt, bias, 15, layout, "silu", dw, glu,
                         stub_calls=rec.rec_dw_calls, stub_args=dw_args)
            assert l[2] == int(wt.dtype == torch.float32) and l[5:11] == [2, 50, 64, 31, 1, int(glu)], l
            assert y.shape == C._out_shape(x, layout, glu)
    # a non-contiguous input is served too (copied first, as Python does)
    xt = xb.transpose(1, 2).contiguous().transpose(1, 2)
    twice(ops.conv1d_depthwise.default, xt, wf, bf, 15, "btc", "silu", dw, False, stub_calls=rec.rec_dw_calls,
          stub_args=lambda: dw_args()[1:])  # (x's copy is a new pointer each call)

    # layer_norm_quant: weight / bias of x's dtype or fp32 or none, normalized or not, int8 and fp8, fp16 and bf16
    import struct
    ln_calls = 0
    for x, wln, bln in ((xb, torch.randn(64).half(), torch.randn(64)), (xb.bfloat16(), torch.randn(64), None),
                        (xb[:1, :7], None, torch.randn(64).half())):
        for normalized, scheme in ((False, "int8"), (True, "fp8")):
            outs, l = twice(ops.layer_norm_quant.default, x, wln, bln, 1e-5, normalized, scheme, "auto",
                            stub_calls=rec.rec_lnq_calls, stub_args=lnq_args)
            ln_calls += 2
            q, scale, y = outs
            mm = x.numel() // 64
            assert l[0] == x.data_ptr() and l[1] == (0 if wln is None else wln.data_ptr()), l
            assert l[2] == int(wln is not None and wln.dtype == torch.float32), l
            assert l[3] == (0 if bln is None else bln.data_ptr()), l
            assert l[4] == int(bln is not None and bln.dtype == torch.float32), l
            assert l[5:9] == [int(normalized), mm, 64, struct.unpack("I", struct.pack("f", 1e-5))[0]], l
            assert q.dtype == L._QDTYPE[scheme] and q.shape == x.shape and scale.shape == (mm,)
            assert torch.equal(scale, torch.arange(mm, dtype=torch.float32) + 0.5)
            assert y.shape == (x.shape if normalized else (0,)) and y.dtype == x.dtype
    hp.collect_calls()
    assert sum(p.calls for p in L._LAUNCHES.values() if p is not None) == ln_calls
    # a row the kernel refuses (the stub's N = 24): Python warns once and runs the reference, C++ never answers it
    x24 = torch.randn(3, 24).half()
    n0 = rec.rec_lnq_calls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            q, scale, _y = ops.layer_norm_quant.default(x24, None, None, 1e-5, False, "int8", "auto")
    assert rec.rec_lnq_calls() == n0 and hits() == 0
    assert any("unaligned" in str(x.message) for x in seen), [str(x.message) for x in seen]
    rq, rs, _ = L.reference_layer_norm_quant(x24, None, None, 1e-5, False, "int8")
    assert torch.equal(q, rq) and torch.equal(scale, rs)
    # another eps, another dtype of weight than the plan's: Python decides (new plans), nothing wrong is reused
    wln = torch.randn(64).half()
    twice(ops.layer_norm_quant.default, xb, wln, None, 1e-6, False, "int8", "auto", stub_calls=rec.rec_lnq_calls,
          stub_args=lnq_args)
    _, l = twice(ops.layer_norm_quant.default, xb, wln.float(), None, 1e-6, False, "int8", "auto",
                 stub_calls=rec.rec_lnq_calls, stub_args=lnq_args)
    assert l[2] == 1 and l[8] == struct.unpack("I", struct.pack("f", 1e-6))[0], l

    # call counts reach the Python plans
    assert sum(p.calls for p in S.served()) == 2 * 5 + 2 * 2, [(p.config, p.calls) for p in S.served()]

    # out_scale: a value made invalid in place (version bump) is read again by Python: the error, not a launch
    bad = torch.full((1,), 0.05)
    twice(ops.scaled_mm_quant.default, a, w, sa, sw, b32, bad, tile, elt=1)
    bad.zero_()
    n0 = rec.rec_smm_calls()
    python_errors([(ops.scaled_mm_quant.default, (a, w, sa, sw, b32, bad, tile), "finite and > 0"),
                   (ops.scaled_mm_act_quant.default, (a, w, sa, sw, b32, bad, "silu", tile), "finite and > 0")])
    assert rec.rec_smm_calls() == n0
    # an out_scale made in inference mode has no version: Python checks it on every call, C++ never answers it
    with torch.inference_mode():
        inf_scale = torch.full((1,), 0.05)
    hp.collect_calls()
    for _ in range(3):
        ops.scaled_mm_act_quant.default(a, w, sa, sw, b32, inf_scale, "gelu", tile)
    assert hits() == 0
    # an alias of a checked buffer (what a compiled graph passes: no _base, its own version counter at 0)
    buf = torch.full((4,), 0.05)
    alias = lambda: torch.empty(0).set_(buf.untyped_storage(), 0, (1,), (1,))
    ops.scaled_mm_quant.default(a, w, sa, sw, b32, alias(), tile)
    hp.collect_calls()
    ops.scaled_mm_quant.default(a, w, sa, sw, b32, alias(), tile)
    assert hits() == 1

    # bad calls after the plans exist: the Python path's errors
    bad_calls = [
        (ops.scaled_mm.default, (a, w, sa[:5].contiguous(), sw, b16, torch.float16, tile), "scale_a"),
        (ops.scaled_mm.default, (a, w, sa, sw, b32, torch.float16, tile), "bias"),
        (ops.scaled_mm.default, (a.float(), w, sa, sw, b16, torch.float16, tile), "int8"),
        (ops.scaled_mm.default, (a, w, sa, sw.double(), b16, torch.float16, tile), "float32"),
        (ops.scaled_mm_act_quant.default, (a, w, sa, sw, b32, out_scale, "relu", tile), "activation"),
        (ops.scaled_mm_residual.default, (a, w, sa, sw, b16, res[:1].contiguous(), 0.1, torch.float16, tile),
         "residual"),
        (ops.scaled_mm_residual.default, (a, w, sa, sw, b16, res, float("inf"), torch.float16, tile), "alpha"),
        (ops.conv1d_depthwise.default, (xb, wf, bf[:7].contiguous(), 15, "btc", "silu", dw, False), "bias"),
        (ops.conv1d_depthwise.default, (xb, wf, bf, 15, "btc", "gelu", dw, False), "activation"),
        (ops.layer_norm_quant.default, (xb, wln[:7].contiguous(), None, 1e-6, False, "int8", "auto"), "weight"),
        (ops.layer_norm_quant.default, (xb, wln.double(), None, 1e-6, False, "int8", "auto"), "weight"),
        (ops.layer_norm_quant.default, (xb.transpose(1, 2), None, None, 1e-6, False, "int8", "auto"), "contiguous"),
        (ops.layer_norm_quant.default, (xb, wln, None, 1e-6, False, "int4", "auto"), "scheme"),
        (ops.layer_norm_quant.default, (xb, wln, None, -1.0, False, "int8", "auto"), "eps"),
    ]
    python_errors(bad_calls)

    # a misaligned operand: Python warns once and serves its reference; no launch
    buf8 = torch.randint(-127, 128, (m * k + 1,), dtype=torch.int8)
    shifted = buf8[1:].view(2, 9, k)
    n0 = rec.rec_smm_calls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = ops.scaled_mm.default(shifted, w, sa, sw, b16, torch.float16, tile)
    assert rec.rec_smm_calls() == n0 and any("aligned" in str(x.message) for x in seen)
    torch.testing.assert_close(y, S.reference_scaled_mm(shifted, w, sa, sw, b16, torch.float16))

    # the torch arm (Python reference code) is never installed: right answers, every call from Python
    hp.collect_calls()
    for _ in range(2):
        y = ops.scaled_mm.default(a, w, sa, sw, b16, torch.float16, "torch")
    assert hits() == 0 and torch.equal(y, S.reference_scaled_mm(a, w, sa, sw, b16, torch.float16))

    # plans are forgotten with the Python ones (any family's reset_plans, a DB reload)
    assert torch.ops.oasr_hot.size() > 0
    residual.reset_plans()
    assert torch.ops.oasr_hot.size() == 0
    twice(ops.scaled_mm.default, a, w, sa, sw, b16, torch.float16, tile)

# the fp8 GEMMs: the int8 ones' hit path with e4m3 operands (the same launcher ABI, an e4m3 quantized output)
from oasr_ops.families.scaled_mm_fp8 import act_quant as act_quant8, ops as F, residual as residual8
E4M3 = torch.float8_e4m3fn
a8 = (torch.randn(2, 9, k) * 8).to(E4M3)
w8 = (torch.randn(n, k) * 8).to(E4M3)
tile8 = "t64x128x128_c1x1_pp"
with torch.no_grad():
    launches = 0
    for scale_a, scale_w in ((sa, sw), (sa[:1].clone(), sw[:1].clone())):
        for bias, out_dtype in ((None, torch.float16), (b16, torch.float16), (b16.bfloat16(), torch.bfloat16)):
            y, l = twice(ops.scaled_mm_fp8.default, a8, w8, scale_a, scale_w, bias, out_dtype, tile8)
            launches += 2
            assert y.shape == (2, 9, n) and y.dtype == out_dtype
            assert l[0] == a8.data_ptr() and l[1] == w8.data_ptr() and l[2] == scale_a.data_ptr(), l
            assert l[3] == int(scale_a.numel() != 1) and l[5] == int(scale_w.numel() != 1)
            assert l[6] == (0 if bias is None else bias.data_ptr()) and l[7] == 0 and l[8] == 0
            assert l[9:14] == [m, n, k, 1, 64], l
    for scale in (out_scale, torch.rand(m) + 0.01):
        for bias in (None, b32):
            y, l = twice(ops.scaled_mm_fp8_quant.default, a8, w8, sa, sw, bias, scale, tile8, elt=1)
            launches += 2
            assert y.dtype == E4M3 and l[7] == scale.data_ptr() and l[8] == int(scale.numel() != 1), l
            assert l[6] == (0 if bias is None else bias.data_ptr())
            for act in ("gelu", "silu"):
                y, l = twice(ops.scaled_mm_fp8_act_quant.default, a8, w8, sa, sw, bias, scale, act, tile8, elt=1)
                assert y.dtype == E4M3 and y.shape == (2, 9, n) and l[7] == scale.data_ptr(), l
                assert l[8] == int(scale.numel() != 1)
    y, l = twice(ops.scaled_mm_fp8_residual.default, a8, w8, sa, sw, b16, res, 0.1, torch.float16, tile8)
    assert y.dtype == torch.float16 and l[7] == res.data_ptr(), l
    assert l[8] == struct.unpack("I", struct.pack("f", 0.1))[0], l
    assert sum(p.calls for p in F.served()) == launches, [(p.config, p.calls) for p in F.served()]
    assert sum(p.calls for p in residual8.served()) == 2

    # an out_scale zeroed in place after its check: Python reads it again, the error, no launch
    bad = torch.full((1,), 0.05)
    twice(ops.scaled_mm_fp8_act_quant.default, a8, w8, sa, sw, b32, bad, "silu", tile8, elt=1)
    bad.zero_()
    n0 = rec.rec_smm_calls()
    python_errors([(ops.scaled_mm_fp8_quant.default, (a8, w8, sa, sw, b32, bad, tile8), "finite and > 0"),
                   (ops.scaled_mm_fp8_act_quant.default, (a8, w8, sa, sw, b32, bad, "silu", tile8), "finite and > 0")])
    assert rec.rec_smm_calls() == n0

    # bad calls after the plans exist: the Python path's errors
    bad_calls = [
        (ops.scaled_mm_fp8.default, (a8, w8, sa[:5].contiguous(), sw, b16, torch.float16, tile8), "scale_a"),
        (ops.scaled_mm_fp8.default, (a8, w8, sa, sw, b32, torch.float16, tile8), "bias"),
        (ops.scaled_mm_fp8.default, (a, w, sa, sw, b16, torch.float16, tile8), "float8_e4m3fn"),
        (ops.scaled_mm_fp8.default, (a8, w8, sa, sw.double(), b16, torch.float16, tile8), "float32"),
        (ops.scaled_mm_fp8_quant.default, (a8, w8, sa, sw, b16, out_scale, tile8), "bias"),
        (ops.scaled_mm_fp8_act_quant.default, (a8, w8, sa, sw, b32, out_scale, "relu", tile8), "activation"),
        (ops.scaled_mm_fp8_residual.default, (a8, w8, sa, sw, b16, res[:1].contiguous(), 0.1, torch.float16, tile8),
         "residual"),
        (ops.scaled_mm_fp8_residual.default, (a8, w8, sa, sw, b16, res, float("inf"), torch.float16, tile8),
         "alpha"),
    ]
    python_errors(bad_calls)

    # a misaligned operand: Python warns once and serves torch._scaled_mm; no launch, no C++ answer
    buf8 = (torch.randn(m * k + 1) * 8).to(E4M3)
    shifted = buf8[1:].view(2, 9, k)
    n0 = rec.rec_smm_calls()
    hp.collect_calls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            y = ops.scaled_mm_fp8.default(shifted, w8, sa, sw, b16.bfloat16(), torch.bfloat16, tile8)
    assert rec.rec_smm_calls() == n0 and hits() == 0 and any("aligned" in str(x.message) for x in seen)
    torch.testing.assert_close(y.float(), F.reference_scaled_mm_fp8(shifted, w8, sa, sw, b16.bfloat16(),
                                                                    torch.bfloat16).float(), rtol=2e-2, atol=1e-2)

    # the torch arm (torch._scaled_mm, Python) is never installed: every call from Python
    for _ in range(2):
        y = ops.scaled_mm_fp8.default(a8, w8, sa, sw, b16.bfloat16(), torch.bfloat16, "torch")
    assert hits() == 0

    # plans are forgotten with the Python ones
    assert torch.ops.oasr_hot.size() > 0
    act_quant8.reset_plans()
    assert torch.ops.oasr_hot.size() == 0
    twice(ops.scaled_mm_fp8.default, a8, w8, sa, sw, b16, torch.float16, tile8)

# grad mode: the forward runs, the backward raises naming the op
rg = res.clone().requires_grad_()
y = ops.scaled_mm_residual.default(a, w, sa, sw, b16, rg, 0.1, torch.float16, tile)
assert y.requires_grad
try:
    y.float().sum().backward()
    raise AssertionError("backward ran")
except RuntimeError as e:
    assert "oasr.scaled_mm_residual has no backward" in str(e), e
xg = xb.clone().requires_grad_()
q, scale, y = ops.layer_norm_quant.default(xg, None, None, 1e-5, True, "int8", "auto")
assert scale.requires_grad and y.requires_grad and not q.requires_grad
try:
    (scale.sum() + y.float().sum()).backward()
    raise AssertionError("backward ran")
except RuntimeError as e:
    assert "oasr.layer_norm_quant has no backward" in str(e), e

# only some ops: the others keep their Python kernels
hp.disable()
hp.enable("CPU", ops=("gemm",))
with torch.no_grad():
    hp.collect_calls()
    y = ops.scaled_mm.default(a, w, sa, sw, b16, torch.float16, tile)
    y8 = ops.scaled_mm_fp8.default(a8, w8, sa, sw, b16, torch.float16, tile8)
assert hits() == 0 and torch.equal(y, S.reference_scaled_mm(a, w, sa, sw, b16, torch.float16))  # the CPU reference
assert torch.equal(y8, F.reference_scaled_mm_fp8(a8, w8, sa, sw, b16, torch.float16))
hp.disable()
print("OK")
'''


@pytest.mark.slow
def test_cpp_hot_path_int8_gemms_and_conv_on_cpu(hot_path_jit):
    """The int8 and fp8 GEMMs, the depthwise conv and layer_norm_quant through the C++ hot path with recording stub
    launchers: each second call is answered in C++ with the launch the Python path made (every pointer, flag and
    shape; alpha's and eps's fp32 bits), a row the LayerNorm kernel refuses goes to Python's warned reference, an
    out_scale is taken only at a version Python checked, bad calls get the Python errors, misaligned operands its
    fallback, the torch arm stays Python, plans are forgotten with the Python ones, grad raises at backward."""
    env = {**os.environ, "OASR_JIT_DIR": str(hot_path_jit), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", f"STUB = {RECORDING_FAMILY_STUB!r}\n" + FAMILY_SCRIPT], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-3000:] + r.stderr[-5000:]
