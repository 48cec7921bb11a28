"""oasr::scaled_mm_act_quant on CPU (reference vs an independent float64 computation, fake, checks), its kernel
variants (the existing variants' sources unchanged; the activation branch only in int8_<act>), the rewrite's
config baking."""
from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import oasr_ops
from oasr_ops.codegen import act_math
from oasr_ops.codegen.render import render
from oasr_ops.families.scaled_mm.lanes import LANES


def _operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    sa = torch.rand(m, generator=g) * 1e-3 + 1e-4
    sw = torch.rand(n, generator=g) * 1e-3 + 1e-4
    bias = torch.randn(n, generator=g)
    return a, w, sa, sw, bias


def _expected(a, w, sa, sw, bias, out_scale, act):
    acc = a.double() @ w.double().t()
    y = sa.double()[:, None] * sw.double()[None, :] * acc + (0 if bias is None else bias.double())
    if act == "gelu":
        y = 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))
    else:
        y = y / (1 + torch.exp(-y))
    return torch.round(y / out_scale.double().reshape(-1, 1)).clamp(-128, 127).to(torch.int8)


@pytest.mark.parametrize("m", [1, 7, 17, 127, 1000])
@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_reference_matches_float64(m, act):
    a, w, sa, sw, bias = _operands(m, 64, 96, m)
    out_scale = torch.tensor([0.02])
    q = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, out_scale, act, bias=bias)
    want = _expected(a, w, sa, sw, bias, out_scale, act)
    assert q.dtype == torch.int8 and q.shape == (m, 64)
    assert (q.int() - want.int()).abs().max() <= 1 and (q == want).float().mean() > 0.99


def test_per_row_out_scale_and_no_bias_and_leading_dims():
    a, w, sa, sw, _ = _operands(12, 32, 48, 3)
    out_scale = torch.rand(12) * 0.05 + 0.01
    q = oasr_ops.scaled_mm_act_quant(a.reshape(3, 4, 48), w, sa, sw, out_scale, "silu")
    assert q.shape == (3, 4, 32)
    want = _expected(a, w, sa, sw, None, out_scale, "silu")
    assert (q.reshape(12, 32).int() - want.int()).abs().max() <= 1


def test_fake_and_checks():
    a, w, sa, sw, bias = _operands(8, 32, 48, 1)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fa = torch.empty(2, 4, 48, dtype=torch.int8)
        out = torch.ops.oasr.scaled_mm_act_quant(fa, w, sa, sw, bias, torch.ones(1), "gelu", "auto")
        assert out.shape == (2, 4, 32) and out.dtype == torch.int8
    with pytest.raises(ValueError, match="activation must be one of"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.ones(1), "relu")
    with pytest.raises(ValueError, match="bias must be float32, float16 or bfloat16, got torch.float64"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.ones(1), "gelu", bias=bias.double())
    with pytest.raises(ValueError, match=r"bias must have shape \(32,\)"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.ones(1), "gelu", bias=bias[:16].half())
    with pytest.raises(ValueError, match="finite and > 0"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.zeros(1), "gelu")
    with pytest.raises(ValueError, match="out_scale must have shape"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.ones(32), "gelu")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16bit_bias_gives_the_result_of_its_fp32_copy(dtype):
    """A 16-bit bias (what the fusion pass passes) is read as it is and converted exactly: the same int8 output as
    the fp32 copy of it, and as the float64 formula."""
    a, w, sa, sw, bias = _operands(17, 64, 96, 11)
    b16, out_scale = (bias * 4).to(dtype), torch.tensor([0.02])
    q = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, out_scale, "gelu", bias=b16)
    assert torch.equal(q, oasr_ops.scaled_mm_act_quant(a, w, sa, sw, out_scale, "gelu", bias=b16.float()))
    assert (q.int() - _expected(a, w, sa, sw, b16.float(), out_scale, "gelu").int()).abs().max() <= 1


@pytest.mark.parametrize("lane", LANES, ids=lambda ln: ln.name)
def test_activation_variants_render_their_branch_and_leave_the_others_alone(lane):
    cfg = lane.default
    plain = render(lane, cfg, "int8")
    assert "ActScale" not in plain and "struct Act" not in plain and "tanh" not in plain
    for act in ("gelu", "silu"):
        src = render(lane, cfg, f"int8_{act}")
        if lane.name == "sm90_int8_wgmma":
            # sm90: the bias add fused into the scale_a multiply, then act(y) / out_scale in one node with one
            # tanh.approx; the plain int8 variant keeps the exact division and the separate bias add
            assert "Compute<oasr::FmaRn, float, float, kRN>, ScaleA, AccW, Bias>" in src
            assert "Compute<oasr::ActScale, ElementD, float, kRN>, BiasedFma, OutScale>" in src
            assert src.count("asm(\"tanh.approx.f32") == 1 and "ex2.approx" not in src and "erff" not in src
            assert ("fminf(y * y, 36.0f)" in src) == (act == "gelu")
            assert "Compute<oasr::QuantRn, ElementD" in plain and "Compute<oasr::QuantRn" not in src
            for name in ("GELU_A", "GELU_B", "GELU_C"):  # the coefficients the CPU reference uses
                assert (f"{getattr(act_math, name)!r}f" in src) == (act == "gelu")
        else:
            assert "using Activated" in src and "struct Act" in src
            assert ("erff" in src) == (act == "gelu") and ("expf(-x)" in src) == (act == "silu")
            assert src.count("QuantRn") == plain.count("QuantRn")
        # a 16-bit bias is the one difference of the _<dtype>bias variants (the element the broadcast reads)
        for suffix, element in (("_fp16bias", "cutlass::half_t"), ("_bf16bias", "cutlass::bfloat16_t")):
            other = render(lane, cfg, f"int8_{act}{suffix}")
            diff = [(x, y) for x, y in zip(src.splitlines(), other.splitlines()) if x != y]
            assert len(src.splitlines()) == len(other.splitlines())
            assert ("using ElementBias = float;", f"using ElementBias = {element};") in diff
            assert all(x == y.replace(f"int8_{act}{suffix}", f"int8_{act}") for x, y in diff
                       if not x.startswith("using ElementBias")), diff
    with pytest.raises(ValueError, match="not supported"):
        render(lane, cfg, "fp16_gelu")
    with pytest.raises(ValueError, match="not supported"):
        render(lane, cfg, "int8_gelu_fp32bias")


def test_rewrite_bakes_the_act_quant_config():
    from oasr_ops.families.graph import rewrite_graph

    a, w, sa, sw, bias = _operands(40, 64, 96, 5)

    def f(a, w, sa, sw, bias, s):
        return torch.ops.oasr.scaled_mm_act_quant(a, w, sa, sw, bias, s, "gelu", "auto")

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f, tracing_mode="fake")(a, w, sa, sw, bias, torch.ones(1))
    res = rewrite_graph(gm.graph, bake=True, arch="sm90")
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.oasr.scaled_mm_act_quant.default)
    assert node.args[6] == "gelu" and node.args[7] not in ("auto",)
    assert any(s.op == "scaled_mm_quant" for s in res.sites)


def test_act_quant_untuned_answer_is_restricted_to_the_act_tiles(monkeypatch):
    from oasr_ops.families.graph import rewrite_graph
    from oasr_ops.families.scaled_mm import act_quant, ops

    n, k, m = 2048, 512, 3984
    shipped = act_quant.ACT_HEURISTIC_TILES
    plain = ops.select_quant_config(n, k, m, "sm90")
    monkeypatch.setattr(act_quant, "ACT_HEURISTIC_TILES", None)
    assert act_quant.select_act_quant_config(n, k, m, "sm90") == plain  # no restriction: the quantizing op's answer
    assert shipped is None  # the one-tanh epilogue: the model's own pick was the measured best (act_quant.py)
    assert act_quant.select_act_quant_config(3072, 768, 12000, "sm90").config == "t128x128x128_c2x1_pp"
    assert plain.tier == "heuristic"  # no measured entry at this signature: the restriction applies
    tiles = tuple(c for c in ops.variants_for(n, k, quant=True, arch="sm90") if c != plain.config)[-2:]
    monkeypatch.setattr(act_quant, "ACT_HEURISTIC_TILES", tiles)
    sel = act_quant.select_act_quant_config(n, k, m, "sm90")
    assert sel.config in tiles and sel.tier == "heuristic" and sel.signature == plain.signature

    # the graph rewrite bakes the same restricted answer into the fused site
    a = torch.zeros(m, k, dtype=torch.int8)
    w = torch.zeros(n, k, dtype=torch.int8)

    def f(a, w, sa, sw, s):
        return torch.ops.oasr.scaled_mm_act_quant(a, w, sa, sw, None, s, "silu", "auto")

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f, tracing_mode="fake")(a, w, torch.ones(m), torch.ones(n), torch.ones(1))
    rewrite_graph(gm.graph, bake=True, arch="sm90")
    node = next(nd for nd in gm.graph.nodes if nd.target is torch.ops.oasr.scaled_mm_act_quant.default)
    assert node.args[7] == sel.config
