"""The ops' CUDA hot paths on the CPU: the production `_cuda` functions with a stub kernel library (as
benchmarks/host_overhead.py runs them) — the int8 GEMMs (families/scaled_mm: `ops.fast_ok`, used by scaled_mm,
scaled_mm_quant, the act-quant and the residual GEMM) and the convs (their plan keys hold everything their checks
read of the operands). Once a call has made its plan, a call with a bad operand still raises the full check's
error — a hit only skips checks its key implies — and a good call after it runs the plan again; a good operand of
another kind (the act-quant's 16-bit bias) makes a plan of its own. In a subprocess:
the stubs replace module globals."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
import host_overhead as H
H._install_stubs(H._stub_library(Path(tempfile.mkdtemp())))
import oasr_ops  # noqa: F401
from oasr_ops.families.scaled_mm import ops

cases = {name: (impl, list(args)) for name, _q, impl, args in H._cases("cpu", 64)
         if name.startswith(("scaled_mm", "conv1d"))}
cases["scaled_mm_quant"] = (ops._scaled_mm_quant_cuda,
                            [cases["scaled_mm"][1][i] for i in range(4)] + [None, torch.full((64,), 0.1), "auto"])

from oasr_ops.families.conv2d_activation import ops as conv2d, ops_quant as conv2d_quant
x4, w4, b4 = torch.randn(2, 16, 16, 8).half(), torch.randn(32, 3, 3, 8).half(), torch.randn(32).half()
cases["conv2d_activation"] = (conv2d._cuda, [x4, w4, b4, [2, 2], [0, 0], "relu", "torch"])
cases["conv2d_activation_quant"] = (conv2d_quant._cuda, [x4, w4, b4, [2, 2], [0, 0], "relu", torch.full((1,), 0.1),
                                                         "torch"])

def noncontig(t):
    return t.t().contiguous().t() if t.dim() == 2 else t.unsqueeze(-1).expand(*t.shape, 2)[..., 0]

BAD = {  # (arg index, bad value from the good one, a word of the expected message)
    "scaled_mm": [(0, lambda t: t.half(), "int8"), (0, noncontig, "contiguous"), (2, lambda t: t.double(), "float32"),
                  (2, lambda t: torch.ones(t.shape[0] + 1), "scale_a"), (3, lambda t: t.half(), "float32"),
                  (4, lambda t: t.float(), "bias"), (4, lambda t: t[:-8].contiguous(), "bias")],
    "scaled_mm_quant": [(5, lambda t: t.double(), "out_scale"), (5, lambda t: torch.ones(3), "out_scale"),
                        (5, lambda t: torch.zeros_like(t), "finite and > 0"), (1, noncontig, "contiguous")],
    "scaled_mm_act_quant": [(5, lambda t: t.half(), "out_scale"), (5, lambda t: torch.zeros_like(t), "finite and > 0"),
                            (4, lambda t: t.double(), "bias"), (4, lambda t: t[:-8].contiguous(), "bias"),
                            (3, lambda t: torch.ones(7), "scale_w")],
    "scaled_mm_residual": [(5, lambda t: t.float(), "residual"), (5, lambda t: t[:-1].contiguous(), "residual"),
                           (5, noncontig, "contiguous"), (6, lambda a: float("nan"), "alpha"),
                           (2, lambda t: t.half(), "float32")],
    "conv1d_depthwise": [(2, lambda t: t[:-8].contiguous(), "bias"), (1, lambda t: t.to("meta"), "device"),
                         (2, lambda t: t.to("meta"), "device"), (1, lambda t: t.double(), "dtype")],
    "conv2d_activation": [(2, lambda t: t[:-8].contiguous(), "bias"), (1, lambda t: t.float(), "dtype"),
                          (1, lambda t: t.to("meta"), "device"), (2, lambda t: t.float(), "dtype")],
    "conv2d_activation_quant": [(2, lambda t: t[:-8].contiguous(), "bias"), (1, lambda t: t.float(), "dtype"),
                                (6, lambda t: t.half(), "out_scale")],
}
with torch.no_grad():
    for name, bad in BAD.items():
        impl, args = cases[name]
        impl(*args)  # makes the plan
        for i, make, word in bad:
            wrong = list(args)
            wrong[i] = make(args[i])
            try:
                impl(*wrong)
            except ValueError as e:
                assert word in str(e), (name, i, word, str(e))
            else:
                raise AssertionError(f"{name}: a bad argument {i} ({word}) ran")
        out = impl(*args)
        assert out.shape[-1] == args[1].shape[0], name  # N for the GEMMs, C / Cout for the convs
# Operands of another kind that are good: each makes a plan of its own (the act-quant's 16-bit bias variants)
# and a call with the first plan's operands after them still runs.
ALSO_GOOD = {"scaled_mm_act_quant": [(4, lambda t: t.half()), (4, lambda t: t.bfloat16())]}
with torch.no_grad():
    for name, good in ALSO_GOOD.items():
        impl, args = cases[name]
        for i, make in good:
            other = list(args)
            other[i] = make(args[i])
            assert impl(*other).shape[-1] == args[1].shape[0], (name, i)
        assert impl(*args).shape[-1] == args[1].shape[0], name
print("ok", sum(len(b) for b in BAD.values()))
'''


@pytest.mark.slow
def test_a_bad_operand_is_refused_after_its_key_has_a_plan():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().startswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
