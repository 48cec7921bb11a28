"""Same input, same answer on every path (issue 12): CPU rejects what CUDA rejects, fakes check the config,
out_scale values are checked, and a backward through an inference op is one clear error, not a warning."""
import warnings

import pytest
import torch

import oasr_ops

BF = torch.bfloat16


def test_gemm_backward_is_a_clear_error_and_forward_does_not_warn():
    a = torch.randn(4, 16, dtype=BF, requires_grad=True)
    w = torch.randn(8, 16, dtype=BF)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "no autograd kernel was registered" warning would raise here
        y = oasr_ops.gemm(a, w)
    with pytest.raises(RuntimeError, match="oasr.gemm has no backward"):
        y.sum().backward()


def test_bmm_and_conv_backward_are_clear_errors():
    a = torch.randn(2, 8, 16, dtype=BF, requires_grad=True)
    with pytest.raises(RuntimeError, match="oasr.bmm has no backward"):
        oasr_ops.bmm(a, torch.randn(2, 16, 8, dtype=BF)).sum().backward()
    x = torch.randn(2, 8, 32, dtype=BF, requires_grad=True)
    with pytest.raises(RuntimeError, match="oasr.conv1d_depthwise has no backward"):
        oasr_ops.conv1d_depthwise(x, torch.randn(8, 1, 3, dtype=BF)).sum().backward()


@pytest.mark.parametrize("path", ["quantize_", "options"])
def test_an_int8_graph_compiled_with_grad_on_runs_and_only_its_backward_raises(path):
    """A forward that forgot torch.no_grad(): AOTAutograd traces the backward while compiling, which used to fail
    the compile on the inference ops' raising backward. Now the compiled forward runs and computes what eager
    computes; only a real .backward() raises, naming the op, as in eager."""
    import copy

    from torch import nn

    from oasr_ops.inductor.backend import oasr_backend

    torch._dynamo.reset()
    torch.manual_seed(0)
    fp = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to(BF).eval()
    x = torch.randn(2, 10, 64, dtype=BF)
    q = oasr_ops.quantize_(copy.deepcopy(fp), "int8_w8a8")
    want = q(x)  # eager, grad on: runs
    if path == "quantize_":
        model = torch.compile(q, backend=oasr_backend)
    else:
        model = torch.compile(copy.deepcopy(fp), backend=oasr_backend, options={"quantization": "int8_w8a8"})
    got = model(x)
    assert got.requires_grad and got.shape == want.shape
    assert float((got.float() - want.float()).abs().max() / want.float().abs().max()) < 3e-2
    # the compiled graph's quantization is fused by default: the first op without a backward may be the LayerNorm's
    with pytest.raises(RuntimeError, match=r"oasr\.(scaled_mm\w*|layer_norm_quant) has no backward"):
        got.float().sum().backward()
    with pytest.raises(RuntimeError, match=r"oasr\.scaled_mm\w* has no backward"):
        want.float().sum().backward()


def test_cpu_rejects_non_contiguous_like_cuda():
    w = torch.randn(8, 16, dtype=BF)
    with pytest.raises(ValueError, match="not contiguous"):
        oasr_ops.gemm(torch.randn(16, 4, dtype=BF).t(), w)
    q = torch.randint(-4, 4, (16, 4), dtype=torch.int8).t()
    wq = torch.randint(-4, 4, (16, 16), dtype=torch.int8)
    with pytest.raises(ValueError, match="not contiguous"):
        oasr_ops.scaled_mm(q, wq, torch.ones(4), torch.ones(16))


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0, float("inf")])
def test_out_scale_must_be_finite_and_positive(bad):
    q = torch.randint(-4, 4, (4, 16), dtype=torch.int8)
    wq = torch.randint(-4, 4, (16, 16), dtype=torch.int8)
    with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
        oasr_ops.scaled_mm_quant(q, wq, torch.ones(4), torch.ones(16), torch.tensor([bad]))
    per_row = torch.ones(4)
    per_row[2] = bad
    with pytest.raises(ValueError, match="out_scale"):
        oasr_ops.scaled_mm_quant(q, wq, torch.ones(4), torch.ones(16), per_row)
    ok = oasr_ops.scaled_mm_quant(q, wq, torch.ones(4), torch.ones(16), torch.tensor([0.5]))
    assert ok.dtype == torch.int8 and ok.shape == (4, 16)


def test_fakes_check_the_config_like_the_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, w = torch.empty(2, 16, dtype=BF), torch.empty(8, 16, dtype=BF)
        with pytest.raises(ValueError, match="unknown config"):
            torch.ops.oasr.gemm(a, w, None, "none", "t999x1x1_c1x1_coop")
        assert torch.ops.oasr.gemm(a, w, None, "none", "auto").shape == (2, 8)
        q, wq = torch.empty(2, 16, dtype=torch.int8), torch.empty(16, 16, dtype=torch.int8)
        with pytest.raises(ValueError, match="config"):
            torch.ops.oasr.scaled_mm(q, wq, torch.empty(2), torch.empty(16), None, torch.float16, "nonsense")
