"""The Conformer conv module (examples/conformer.py, conv_impl="conv1d") compiled with backend="oasr" on the GPU:
both pointwise convs run as GEMMs on [B, T, C], the depthwise conv with GLU in its prologue (no mask) or after
the masked GLU (mask), BatchNorm folded, SiLU fused; fp16/bf16, T 1/7/250/301, with and without a padding mask,
under mode="reduce-overhead" (CUDA graphs); error vs the fp32 eager module < 1e-2 relative. Four compiles
(a minute or two).

Run: ``pytest -m gpu tests/test_conv_module_gpu.py``.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402,F401
from examples import conformer  # noqa: E402
from oasr_ops.families.conv1d import ops as dw_ops  # noqa: E402
from oasr_ops.families.gemm import ops as gemm_ops  # noqa: E402
from oasr_ops.inductor.backend import oasr_backend  # noqa: E402
from oasr_ops.inductor.rewrite import clear_rewrite_log, rewrite_log  # noqa: E402


def module(d=256, kw=31, seed=0):
    cfg = conformer.config_for("S", d_model=d, num_heads=4, conv_kernel=kw, conv_impl="conv1d")
    torch.manual_seed(seed)
    m = conformer.Conv1dConvolutionModule(cfg).eval().cuda()
    with torch.no_grad():
        m.conv_norm.running_mean.uniform_(-0.5, 0.5)
        m.conv_norm.running_var.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("dtype,t,masked", [(torch.float16, 250, False), (torch.float16, 7, True),
                                            (torch.bfloat16, 301, True), (torch.bfloat16, 1, False)],
                         ids=["fp16-250", "fp16-7-masked", "bf16-301-masked", "bf16-1"])
def test_compiled_conv_module_matches_fp32(dtype, t, masked):
    torch._dynamo.reset()
    dw_ops.reset_plans()
    gemm_ops.reset_plans()
    clear_rewrite_log()
    m32 = module()
    x = torch.randn(3, t, 256, device="cuda")
    mask = (torch.arange(t, device="cuda")[None] < torch.tensor([t, t // 2 + 1, min(t, 3)], device="cuda")[:, None]) \
        if masked else None
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):  # the pass runs: its log is read
        expect = m32(x, mask)
        mlow = module().to(dtype)
        # the callable, not the name: a checkout on PYTHONPATH has no entry point registering "oasr"
        fn = torch.compile(mlow, backend=oasr_backend, mode="reduce-overhead", dynamic=False)
        for _ in range(3):  # warm-up, record, replay
            got = fn(x.to(dtype), mask)
        torch.cuda.synchronize()
    assert torch.isfinite(got).all()
    err = float((got.float() - expect).abs().max() / expect.abs().max())
    assert err < 1e-2, err
    served = dw_ops.served()
    assert any(p.config != "torch" for p in served), served  # a depthwise kernel ran, not cuDNN
    sites = [(st.family, st.n, st.k) for r in rewrite_log() for st in r.sites]
    # both pointwise convs became GEMMs on [B, T, C] (oasr.gemm, or aten.mm where the DB answers cuBLAS), the
    # depthwise conv the oasr op; no convolution was left to cuDNN
    assert sorted(sites) == [("conv1d", 256, 31), ("gemm", 256, 256), ("gemm", 512, 256)], sites
    assert not [why for r in rewrite_log() for _, why in r.skipped if "conv" in why], rewrite_log()[-1].skipped
