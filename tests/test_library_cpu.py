"""oasr::gemm on the CPU: schema, fake, opcheck, reference numerics, error paths."""
import pytest
import torch
import torch.nn.functional as F

import oasr_ops
from oasr_ops.families.gemm.ops import format_table, parse_table, resolve_table


def _inputs(m=17, n=64, k=32, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return a, w, b


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 7, 17, 127, 1000])
def test_reference_numerics(act, dtype, m):
    a, w, b = _inputs(m=m, dtype=dtype, seed=m)
    for bias in (None, b):
        out = torch.ops.oasr.gemm(a, w, bias, act, "auto")
        y = a.double() @ w.double().t() + (0 if bias is None else bias.double())
        ref = {"none": y, "relu": torch.relu(y), "gelu": F.gelu(y), "silu": F.silu(y)}[act]
        assert out.dtype == dtype and out.shape == (m, 64)
        assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-2


def test_3d_input_and_python_api():
    a, w, b = _inputs(m=24)
    out = oasr_ops.gemm(a.view(2, 12, 32), w, b, "silu")
    assert out.shape == (2, 12, 64)
    assert torch.equal(out.view(24, 64), torch.ops.oasr.gemm(a, w, b, "silu", "auto"))


def test_m_zero_returns_empty():
    a, w, b = _inputs()
    out = torch.ops.oasr.gemm(a[:0], w, b, "none", "auto")
    assert out.shape == (0, 64)


@pytest.mark.parametrize("config", ["auto", "default", "torch", "fused", "t128x128x64_c2x1_coop",
                                    "b64x64x64_w32x32x64_s3_k2"])
def test_opcheck(config):
    a, w, b = _inputs()
    torch.library.opcheck(torch.ops.oasr.gemm.default, (a, w, b, "gelu", config))
    torch.library.opcheck(torch.ops.oasr.gemm.default, (a.view(1, 17, 32), w, None, "none", config))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(3, 5, 32, dtype=torch.float16)
        w = torch.empty(48, 32, dtype=torch.float16)
        out = torch.ops.oasr.gemm(a, w, None, "relu", "auto")
    assert out.shape == (3, 5, 48) and out.dtype == torch.float16


@pytest.mark.parametrize("case,match", [
    (lambda a, w, b: (a.float(), w, b, "none", "auto"), "dtype"),
    (lambda a, w, b: (a, w.half(), b, "none", "auto"), "dtype"),
    (lambda a, w, b: (a, w[:, :16], b, "none", "auto"), "K mismatch"),
    (lambda a, w, b: (a, w, b[:10], "none", "auto"), "bias must have shape"),
    (lambda a, w, b: (a, w, b.half(), "none", "auto"), "bias has dtype"),
    (lambda a, w, b: (a, w, b, "tanh", "auto"), "unknown activation"),
    (lambda a, w, b: (a, w, b, "none", "b1x1x1"), "unknown config"),
    (lambda a, w, b: (a, w, b, "none", "regions:12=nope;*=torch"), "unknown config"),
    (lambda a, w, b: (a, w.view(1, 64, 32), b, "none", "auto"), "2-D"),
])
def test_errors_name_the_problem(case, match):
    a, w, b = _inputs()
    with pytest.raises((ValueError, RuntimeError), match=match):
        torch.ops.oasr.gemm(*case(a, w, b))


def test_region_tables_round_up():
    t = format_table([(16, "t64x32x64_c1x1_pp"), (512, "t64x128x64_c1x1_pp"), (None, "torch")])
    assert parse_table(t)[0] == (16, "t64x32x64_c1x1_pp")
    assert resolve_table(t, 1) == "t64x32x64_c1x1_pp"
    assert resolve_table(t, 16) == "t64x32x64_c1x1_pp"
    assert resolve_table(t, 17) == "t64x128x64_c1x1_pp"
    assert resolve_table(t, 100000) == "torch"
    open_ended = format_table([(64, "t64x64x64_c1x1_pp")])
    assert resolve_table(open_ended, 65) == "auto"  # above the largest measured M: next tier decides


def test_k_zero_is_bias_then_activation():
    a = torch.empty(5, 0, dtype=torch.bfloat16)
    w = torch.empty(8, 0, dtype=torch.bfloat16)
    b = torch.randn(8).to(torch.bfloat16)
    out = torch.ops.oasr.gemm(a, w, b, "relu", "auto")
    assert torch.equal(out, torch.relu(b).expand(5, 8))
