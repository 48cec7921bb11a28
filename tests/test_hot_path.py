"""The C++ hot path of `oasr::gemm` on the CPU (families/hot_path.py, templates/hot_path.cpp, codegen/host_ext.py).

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
def test_cpp_hot_path_on_cpu(tmp_path):
    env = {**os.environ, "OASR_JIT_DIR": str(tmp_path / "jit"), "PYTHONPATH": str(ROOT)}
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
    """The backend enables the hot path from inside Dynamo's compile (a real torch.compile, the real build): no
    tracing mode sees the registration, the compiled model still computes the model."""
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


def test_enable_from_env_without_cuda_keeps_python(monkeypatch):
    """OASR_CPP_HOT_PATH=1 on a machine without CUDA: nothing changes (the hot path serves CUDA only)."""
    from oasr_ops.families import hot_path

    monkeypatch.setenv(hot_path.ENV, "1")
    hot_path.enable_from_env()
    assert hot_path.enabled() is None
