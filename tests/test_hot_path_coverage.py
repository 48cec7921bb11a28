"""A compiled model served without CUDA graphs calls every oasr op through the C++ hot path once warm: no call of the
fp16 `backend="oasr"` Conformer nor of its int8 form (`fuse_quantization="act"`, `fuse_residual=True`: the act-quant
GEMM with the model's fp16 bias, the residual GEMM, scaled_mm), nor of the int8 one compiled under Inductor's
freezing (its per-tensor out_scales are constants then: backend._keep_small_constants_under_freezing), nor of its
fp8 form (`fuse_quantization=True`, `fuse_residual=True`: the fp8 GEMMs, the fused fc1, the residual GEMM, the
LayerNorms' e4m3 quantization), falls back to Python after its plan is made — a miss costs a Python call (~10 us
of host time, benchmarks/host_overhead.py) where serving is host-bound. On the CPU: the real compile, fusion passes
and C++ hot path at the CPU key, the kernel library replaced by benchmarks/host_overhead.py's stub (so outputs are
not meaningful; only who answered each call is counted). In a subprocess: the stubs replace module globals."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import collections, copy, sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
import host_overhead as H
import oasr_ops
from examples.conformer import build_model, example_inputs
from oasr_ops.families import hot_path as hp
from oasr_ops.inductor import backend as be
from oasr_ops.inductor.backend import oasr_backend

model = build_model("S", num_layers=2)  # fp16
calib = [example_inputs(2, 300, seed=1, with_lengths=True), example_inputs(1, 200, seed=2, with_lengths=True)]
q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8",
                       filter_fn=oasr_ops.fusable_filter(copy.deepcopy(model), *calib[0]))
oasr_ops.calibrate(q, calib)  # on the CPU reference path, before the stubs
q8 = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8",
                        filter_fn=oasr_ops.fusable_filter(copy.deepcopy(model), *calib[0]))
oasr_ops.calibrate(q8, calib)
H._install_stubs(H._stub_library(Path(tempfile.mkdtemp())))
be._any_cuda = lambda inputs: True  # as for CUDA inputs
hp.enable("CPU")

python_calls = collections.Counter()  # the calls C++ handed to Python (its miss path: the op's `_<op>_py` twin)
for op in hp.served_ops():
    def counted(*args, _fn=hp.BACKEND_KERNELS[(f"oasr::{op}", "CUDA")][0], _op=op):
        python_calls[_op] += 1
        return _fn(*args)
    hp._python_impl_lib.impl(f"_{op}_py", counted, "CPU", allow_override=True)

slot_op = {}  # C++ table slot -> op, recorded as plans are installed
install = hp.install
def recording_install(op, *args, **kw):
    before = len(hp._slots)
    install(op, *args, **kw)
    slot_op.update({s: op for s in range(before, len(hp._slots))})
hp.install = recording_install

def calls_per_op():
    """Each op's calls so far over its installed plans (`collect_calls` adds the ones C++ answered)."""
    hp.collect_calls()
    per_op = collections.Counter()
    for slot, plan in enumerate(hp._slots):
        per_op[slot_op[slot]] += plan.calls
    return per_op

want_ops = {"fp16-oasr": {"gemm", "conv1d_depthwise"},
            "int8": {"scaled_mm", "scaled_mm_act_quant", "scaled_mm_residual", "conv1d_depthwise"}}
want_ops["int8-frozen"] = want_ops["int8"] | {"gemm"}
want_ops["fp8"] = {"scaled_mm_fp8", "scaled_mm_fp8_act_quant", "scaled_mm_fp8_residual", "layer_norm_quant",
                   "conv1d_depthwise"}
INT8 = {"fuse_quantization": "act", "fuse_residual": True}
FP8 = {"fuse_quantization": True, "fuse_residual": True}
for name, m, opts in (("fp16-oasr", model, {}), ("int8", q, INT8), ("int8-frozen", q, INT8), ("fp8", q8, FP8)):
    torch.compiler.reset()
    # freezing is read while Dynamo traces: every (re)compile of the frozen variant happens under the flag
    with torch.no_grad(), torch._inductor.config.patch(freezing=name.endswith("frozen")):
        fn = torch.compile(copy.deepcopy(m), backend=oasr_backend, dynamic=True, options=opts)
        requests = [example_inputs(1, 485, seed=5, with_lengths=True),
                    example_inputs(4, 700, seed=6, with_lengths=True)]
        for r in requests * 2:  # compile, make the plans, install them
            fn(*r)
        for r in requests:
            before = calls_per_op()
            python_calls.clear()
            fn(*r)
            cpp = calls_per_op() - before - python_calls  # a Python call counts on its plan too
            print(name, tuple(r[0].shape), "C++:", dict(cpp), "Python:", dict(python_calls), flush=True)
            assert not python_calls, (name, dict(python_calls))
            assert want_ops[name] <= set(cpp), (name, dict(cpp))
print("ok")
'''


@pytest.mark.slow
def test_a_served_model_calls_no_oasr_op_through_python_once_warm(hot_path_jit):
    env = {**os.environ, "OASR_JIT_DIR": str(hot_path_jit), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-5000:]
