"""The host-time tools run end to end on the CPU: benchmarks/host_overhead.py (stub kernels, the C++ hot-path probe
built with g++ against the installed torch) and benchmarks/e2e_serving.py's CPU smoke path (dynamic shapes through
both backends, the timed parts skipped)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=900)


@pytest.mark.slow
def test_host_overhead_with_the_cpp_probe(tmp_path):
    out = tmp_path / "host.json"
    r = _run("benchmarks/host_overhead.py", "--calls", "20", "--blocks", "1", "--cpp-probe", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["us_per_call"]
    for name in ("gemm", "gemm_torch_arm", "scaled_mm", "scaled_mm_act_quant", "scaled_mm_residual",
                 "layer_norm_quant", "conv1d_depthwise"):
        assert set(rows[name]) == {"impl", "op"} and all(v > 0 for v in rows[name].values()), name
    for name in ("floor", "aten/addmm_small", "cpp/floor", "cpp/gemm_kernel_arm", "cpp/gemm_torch_arm"):
        assert rows[name]["op"] > 0, name


@pytest.mark.slow
def test_cpp_probe_computes_addmm_and_refuses_a_key_without_a_plan(tmp_path):
    """The probe's torch arm is at::addmm on the rows (what it times is the real GEMM), and a key nobody installed
    raises instead of running something."""
    code = f"""
import sys, tempfile, ctypes
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch, host_overhead as H
tmp = Path({str(tmp_path)!r})
H._install_stubs(H._stub_library(tmp))
stub = ctypes.CDLL(str(tmp / "stub.so")).oasr_smm_run
H._cpp_probe(tmp, 8, stub, 1, 1, lambda: None)
ops = torch.ops.oasr_hostbench_cpp
a, w, b = torch.randn(5, 16), torch.randn(24, 16), torch.randn(24)
ops.install.default("x", 5, 24, 16, True, 0)
assert torch.equal(ops.gemm.default(a, w, b, "none", "x", 0), torch.addmm(b, a, w.t()))

def refused(why, *args):
    try:
        ops.gemm.default(*args, "none", "x", 0)
    except RuntimeError as e:
        assert why in str(e), e
    else:
        raise AssertionError("ran: " + why)

refused("no plan installed", a, w, None)
refused("no backward", a, w.requires_grad_(True), b)
print("ok")
"""
    r = _run("-c", code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.slow
def test_e2e_serving_cpu_smoke(tmp_path):
    out = tmp_path / "serving.json"
    r = _run("benchmarks/e2e_serving.py", "--device", "cpu", "--model-args", "size=S,num_layers=2",
             "--variants", "fp16,fp16-oasr", "--requests", "2", "--batches", "1,2", "--max-s", "2.5",
             "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["graphs"]) == {"fp16", "fp16-oasr"}
    assert all(e < 1e-2 for e in res["worst_rel_err"].values())
