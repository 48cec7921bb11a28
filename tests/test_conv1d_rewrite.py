"""The conv1d family's graph rewrite on FX graphs of a Conformer conv module (make_fx, fake tracing, CPU)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

import oasr_ops  # noqa: F401
from examples import conformer
from oasr_ops.families.conv1d.lanes import DWCONV_DEFAULT
from oasr_ops.families.conv1d.rewrite import rewrite

aten = torch.ops.aten
C, KW = 16, 7


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def oasr_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.oasr.conv1d_depthwise.default]


def params(seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(C, 1, KW, generator=g) / KW ** 0.5).to(dtype)
    b = torch.randn(C, generator=g).to(dtype)
    gamma = (torch.rand(C, generator=g) + 0.5).to(dtype)
    beta = torch.randn(C, generator=g).to(dtype)
    mean = torch.randn(C, generator=g).to(dtype)
    var = (torch.rand(C, generator=g) + 0.5).to(dtype)
    return w, b, gamma, beta, mean, var


def reference(x_bct, w, b, gamma, beta, mean, var, silu=True, bn=True):
    y = F.conv1d(x_bct.double(), w.double(), b.double(), padding=KW // 2, groups=C)
    if bn:
        y = (y - mean.double()[:, None]) / torch.sqrt(var.double()[:, None] + 1e-5) * gamma.double()[:, None] \
            + beta.double()[:, None]
    return y * torch.sigmoid(y) if silu else y


def close(a, r):
    err = (a.double() - r).abs().max() / r.abs().max()
    assert err < 1e-2, err


def post_grad_btc(x, w, b, gamma, beta, mean, var):
    """The post-grad form of the Linear-style module: permute in, conv, BN (no-training), upcast SiLU, permute out."""
    y = aten.convolution.default(x.permute(0, 2, 1), w, b, [1], [KW // 2], [1], False, [0], C)
    y = aten._native_batch_norm_legit_no_training.default(y, gamma, beta, mean, var, 0.1, 1e-5)[0]
    z = y.float()
    return (z * torch.sigmoid(z)).to(x.dtype).permute(0, 2, 1)


def test_btc_chain_becomes_one_op():
    x = torch.randn(2, 37, C, dtype=torch.float16)
    p = params()
    gm = make_fx(post_grad_btc, tracing_mode="fake")(x, *p)
    res = rewrite(gm.graph, SimpleNamespace(bake=False))
    gm.graph.lint()
    gm.recompile()
    assert [(s.layout, s.activation, s.batch_norm, s.channels, s.kernel_width, s.config) for s in res.sites] == [
        ("btc", "silu", True, C, KW, "auto")]
    assert res.sites[0].signature == f"conv1d|op=conv1d_btc|dt=half|N={C}|K={KW}"
    t = targets(gm)
    for gone in (aten.convolution.default, aten._native_batch_norm_legit_no_training.default, aten.sigmoid.default,
                 aten.permute.default):
        assert gone not in t
    (node,) = oasr_nodes(gm)
    assert node.args[0].op == "placeholder" and node.args[4:7] == ("btc", "silu", "auto")
    assert node.meta["val"].shape == x.shape
    out = gm(x, *p)
    assert out.shape == x.shape and out.is_contiguous()
    close(out, reference(x.transpose(1, 2), *p).transpose(1, 2))


def post_grad_exp_silu_after_transpose(x, w, b, gamma, beta, mean, var):
    """The Linear form with Inductor's other SiLU decomposition: BN, transpose back, then cast(z / (1 + exp(-z)))."""
    y = aten.convolution.default(x.permute(0, 2, 1), w, b, [1], [KW // 2], [1], False, [0], C)
    y = aten._native_batch_norm_legit_no_training.default(y, gamma, beta, mean, var, 0.1, 1e-5)[0]
    z = y.permute(0, 2, 1).float()
    return (z / (torch.exp(-z) + 1)).to(x.dtype)


def test_silu_after_the_transpose_back_and_exp_decomposition():
    x = torch.randn(2, 29, C, dtype=torch.float16)
    p = params(2)
    gm = make_fx(post_grad_exp_silu_after_transpose, tracing_mode="fake")(x, *p)
    res = rewrite(gm.graph, SimpleNamespace(bake=False))
    gm.graph.lint()
    gm.recompile()
    assert [(s.layout, s.activation, s.batch_norm) for s in res.sites] == [("btc", "silu", True)]
    t = targets(gm)
    assert aten.exp.default not in t and aten.div.Tensor not in t and aten.permute.default not in t
    out = gm(x, *p)
    close(out, reference(x.transpose(1, 2), *p).transpose(1, 2))


def test_btc_without_transpose_back_yields_a_bct_view():
    def f(x, w, b):
        return aten.convolution.default(x.transpose(1, 2), w, b, [1], [KW // 2], [1], False, [0], C)

    x = torch.randn(2, 9, C, dtype=torch.bfloat16)
    w, b = params(1, torch.bfloat16)[:2]
    gm = make_fx(f, tracing_mode="fake")(x, w, b)
    res = rewrite(gm.graph, None)
    gm.recompile()
    assert [(s.layout, s.activation, s.batch_norm) for s in res.sites] == [("btc", "none", False)]
    out = gm(x, w, b)
    assert out.shape == (2, C, 9)
    close(out, reference(x.transpose(1, 2), w, b, *params(1)[2:], silu=False, bn=False))


def test_conformer_conv1d_module_bct():
    """examples/conformer.py conv_impl="conv1d": the depthwise conv + BatchNorm1d + SiLU become one op in the
    [B, C, T] layout; this matcher leaves the 1x1 pointwise convs alone and unreported (families/conv1d/pointwise.py
    owns them: tests/test_conv1d_pointwise.py runs the whole family handler on this module)."""
    cfg = conformer.config_for("S", d_model=32, num_heads=2, conv_kernel=15, conv_impl="conv1d")
    torch.manual_seed(0)
    mod = conformer.Conv1dConvolutionModule(cfg).eval()
    with torch.no_grad():
        mod.conv_norm.running_mean.uniform_(-0.5, 0.5)
        mod.conv_norm.running_var.uniform_(0.5, 1.5)
    ref_out = mod(torch.randn(2, 50, 32))  # warm: nothing
    mod = mod.half()
    state = {**dict(mod.named_parameters()), **dict(mod.named_buffers())}

    def f(state, x):
        return functional_call(mod, state, (x,))

    x = torch.randn(2, 50, 32, dtype=torch.float16)
    gm = make_fx(f, tracing_mode="fake")(state, x)
    res = rewrite(gm.graph, SimpleNamespace(bake=False))
    gm.recompile()
    assert [(s.layout, s.activation, s.batch_norm, s.kernel_width) for s in res.sites] == [("bct", "silu", True, 15)]
    assert res.skipped == []
    assert targets(gm).count(aten.convolution.default) == 2 and aten.native_batch_norm.default not in targets(gm)
    out = gm(state, x)
    with torch.no_grad():
        expect = mod.float()(x.float())
    assert ref_out.shape == out.shape
    err = (out.float() - expect).abs().max() / expect.abs().max()
    assert err < 2e-2, err


def test_non_matching_convs_are_left_alone():
    def f(x, w, wfull, x32, w32):
        a = aten.convolution.default(x, w, None, [2], [KW // 2], [1], False, [0], C)       # stride 2
        b = aten.convolution.default(x, w, None, [1], [0], [1], False, [0], C)             # valid padding
        c = aten.convolution.default(x, wfull, None, [1], [1], [1], False, [0], 1)          # regular conv
        d = aten.convolution.default(x32, w32, None, [1], [KW // 2], [1], False, [0], C)    # fp32
        e = aten.convolution.default(x, w * 2, None, [1], [KW // 2], [1], False, [0], C)    # computed weight
        return a, b, c, d, e

    x = torch.randn(1, C, 20, dtype=torch.float16)
    args = (x, params()[0], torch.randn(C, C, 3, dtype=torch.float16), x.float(), params()[0].float())
    gm = make_fx(f, tracing_mode="fake")(*args)
    before = targets(gm)
    res = rewrite(gm.graph, None)
    assert res.sites == [] and targets(gm) == before
    reasons = [why for _, why in res.skipped]
    assert len(reasons) == 5
    for want, got in zip(("stride 1", "'same' padding", "not depthwise", "dtype", "not a parameter"), reasons):
        assert want in got, (want, got)


def test_shared_conv_output_is_not_fused():
    def f(x, w, b, gamma, beta, mean, var):
        y = aten.convolution.default(x, w, b, [1], [KW // 2], [1], False, [0], C)
        z = aten._native_batch_norm_legit_no_training.default(y, gamma, beta, mean, var, 0.1, 1e-5)[0]
        return z, y + 1

    x = torch.randn(2, C, 11, dtype=torch.float16)
    p = params(2)
    gm = make_fx(f, tracing_mode="fake")(x, *p)
    res = rewrite(gm.graph, None)
    gm.recompile()
    assert [(s.layout, s.batch_norm, s.activation) for s in res.sites] == [("bct", False, "none")]
    z, y1 = gm(x, *p)
    close(y1 - 1, reference(x, *p, silu=False, bn=False))


def test_static_shapes_bake_the_selection(tuning_env):
    x = torch.randn(2, 37, C, dtype=torch.float16)
    gm = make_fx(post_grad_btc, tracing_mode="fake")(x, *params())
    res = rewrite(gm.graph, SimpleNamespace(bake=True, arch="sm90"))
    assert res.sites[0].config == DWCONV_DEFAULT.id and oasr_nodes(gm)[0].args[6] == DWCONV_DEFAULT.id


@pytest.mark.slow
def test_export_graph_of_the_linear_module():
    """torch.export + run_decompositions (the ATen spelling the post-grad pass sees) of a Linear-style module."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = torch.nn.Conv1d(C, C, KW, padding=KW // 2, groups=C)
            self.bn = torch.nn.BatchNorm1d(C)

        def forward(self, x):
            return F.silu(self.bn(self.dw(x.transpose(1, 2)))).transpose(1, 2)

    m = M().eval().half()
    x = torch.randn(2, 20, C, dtype=torch.float16)
    ep = torch.export.export(m, (x,)).run_decompositions()
    gm = ep.graph_module
    res = rewrite(gm.graph, SimpleNamespace(bake=False))
    assert [(s.layout, s.activation, s.batch_norm) for s in res.sites] == [("btc", "silu", True)]
    assert aten.convolution.default not in targets(gm)


def post_grad_decomposed_bn(x, w, b, gamma, beta, mean, var):
    """Inductor's BatchNorm decomposition (the CPU census trace): sub / mul by [C, 1] vectors in fp32, cast back,
    then the exp/div SiLU."""
    y = aten.convolution.default(x.permute(0, 2, 1), w, b, [1], [KW // 2], [1], False, [0], C)
    y = y - mean.float().unsqueeze(-1)
    y = y * (torch.sqrt(var.float() + 1e-5).reciprocal() * 1).unsqueeze(-1)
    y = (y * gamma.unsqueeze(-1) + beta.unsqueeze(-1)).to(x.dtype)
    z = y.float()
    return (z / (torch.exp(-z) + 1)).to(x.dtype).permute(0, 2, 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decomposed_batch_norm_is_folded(dtype):
    x = torch.randn(2, 31, C, dtype=dtype)
    p = params(3, dtype)
    gm = make_fx(post_grad_decomposed_bn, tracing_mode="fake")(x, *p)
    res = rewrite(gm.graph, SimpleNamespace(bake=False))
    gm.graph.lint()
    gm.recompile()
    assert [(s.layout, s.activation, s.batch_norm) for s in res.sites] == [("btc", "silu", True)]
    t = targets(gm)
    assert aten.sub.Tensor not in t and aten.exp.default not in t and aten.convolution.default not in t
    close(gm(x, *p), reference(x.transpose(1, 2), *p).transpose(1, 2))


def test_affine_by_an_activation_is_not_folded():
    def f(x, w, s):  # a per-channel-looking [C, 1] scale computed from the activations: not a BatchNorm
        y = aten.convolution.default(x, w, None, [1], [KW // 2], [1], False, [0], C)
        scale = x.float().mean(dim=(0, 2)).unsqueeze(-1)
        return (y * scale).to(x.dtype)
    x = torch.randn(2, C, 9, dtype=torch.float16)
    w = params()[0]
    gm = make_fx(f, tracing_mode="fake")(x, w, None)
    res = rewrite(gm.graph, SimpleNamespace(bake=False))
    assert [(s.batch_norm, s.activation) for s in res.sites] == [(False, "none")]
    assert aten.mul.Tensor in targets(gm)
