"""The conv module in [B, T, C]: pointwise convs -> the gemm family's GEMM on the untransposed tensor, transposes
sunk through GLU and the padding mask, the depthwise conv in layout btc (families/conv1d/pointwise.py). FX graphs
in the post-grad form Inductor hands the pass on CUDA (make_fx, CPU: the oasr ops run their references)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from torch.func import functional_call

import oasr_ops  # noqa: F401
from examples import conformer
from oasr_ops.families.graph import rewrite_graph

aten = torch.ops.aten
D, KW = 16, 7


def params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(dtype)  # noqa: E731
    return dict(w1=r(2 * D, D, 1, scale=D ** -0.5), b1=r(2 * D), wd=r(D, 1, KW, scale=KW ** -0.5), bd=r(D),
                gamma=(torch.rand(D, generator=g) + 0.5).to(dtype), beta=r(D), mean=r(D),
                var=(torch.rand(D, generator=g) + 0.5).to(dtype), w2=r(D, D, 1, scale=D ** -0.5), b2=r(D))


def module(x, keep, w1, b1, wd, bd, gamma, beta, mean, var, w2, b2):
    """Conv1dConvolutionModule's post-grad ATen form (CUDA keeps the no-training BatchNorm undecomposed)."""
    y = aten.convolution.default(x.permute(0, 2, 1), w1, b1, [1], [0], [1], False, [0], 1)
    y = aten.glu.default(y, 1)
    if keep is not None:
        y = aten.where.self(keep.unsqueeze(1).bitwise_not(), torch.zeros((), dtype=y.dtype), y)
    y = aten.convolution.default(y, wd, bd, [1], [KW // 2], [1], False, [0], D)
    y = aten._native_batch_norm_legit_no_training.default(y, gamma, beta, mean, var, 0.1, 1e-5)[0]
    y = F.silu(y)
    y = aten.convolution.default(y, w2, b2, [1], [0], [1], False, [0], 1)
    return y.permute(0, 2, 1)


def module_cuda_211(x, keep, w1, b1, wd, bd, gamma, beta, mean, var, w2, b2, silu=True):
    """The same module in the post-grad form torch 2.11 hands the pass on CUDA (dumped on the H200 with
    benchmarks/pass_graph_dump.py): the BatchNorm decomposed with fp32 statistics and no cast back to fp16, the
    SiLU read through a no-op fp32 cast and decomposed as div(z, 1 + exp(-z)), cast back after it."""
    f32 = torch.ops.prims.convert_element_type.default
    y = aten.convolution.default(x.permute(0, 2, 1), w1, b1, [1], [0], [1], False, [0], 1)
    y = aten.glu.default(y, 1)
    if keep is not None:
        y = aten.where.self(keep.unsqueeze(1).bitwise_not(), torch.zeros((), dtype=y.dtype), y)
    y = aten.convolution.default(y, wd, bd, [1], [KW // 2], [1], False, [0], D)
    y = aten.sub.Tensor(y, aten.unsqueeze.default(f32(mean, torch.float32), -1))  # fp16 - fp32 -> fp32
    inv = aten.reciprocal.default(aten.sqrt.default(aten.add.Tensor(f32(var, torch.float32), 1e-5)))
    y = aten.mul.Tensor(y, aten.unsqueeze.default(aten.mul.Tensor(inv, 1), -1))
    y = aten.mul.Tensor(y, aten.unsqueeze.default(gamma, -1))
    y = aten.add.Tensor(y, aten.unsqueeze.default(beta, -1))
    if not silu:  # the fp32 affine result read as it is: not foldable (its consumer expects fp32)
        return aten.permute.default(y, [0, 2, 1])
    z = f32(y, torch.float32)
    y = f32(aten.div.Tensor(z, aten.add.Tensor(aten.exp.default(aten.neg.default(z)), 1)), x.dtype)
    y = aten.convolution.default(y, w2, b2, [1], [0], [1], False, [0], 1)
    return y.permute(0, 2, 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_conv_module_in_torch_2_11_cuda_form(dtype, masked):
    """The second pointwise conv stayed on aten on the H200 (torch 2.11): the BatchNorm ending in fp32 was not
    folded, so the SiLU was not fused and the conv read an elementwise result instead of the op's transposed view."""
    t = 37
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, t, D, generator=g).to(dtype)
    keep = (torch.arange(t)[None] < torch.tensor([t, 20])[:, None]) if masked else None
    p = params(dtype)
    names = list(p)
    gm = make_fx(lambda x, keep, *ps: module_cuda_211(x, keep, **dict(zip(names, ps))),
                 tracing_mode="fake")(x, keep, *p.values())
    res = rewrite_graph(gm.graph, bake=False)
    gm.graph.lint()
    gm.recompile()
    assert [(s.family, s.n, s.k) for s in res.sites] == [("gemm", 2 * D, D), ("conv1d", D, KW), ("gemm", D, D)]
    assert aten.convolution.default not in calls(gm) and aten.exp.default not in calls(gm)
    dw = next(n for n in gm.graph.nodes if n.target == torch.ops.oasr.conv1d_depthwise.default)
    assert dw.args[5] == "silu"
    ref = reference(x, keep, p)
    out = gm(x, keep, *p.values())
    assert out.dtype == dtype and out.shape == ref.shape
    assert (out.double() - ref).abs().max() / ref.abs().max() < 2e-2


def test_fp32_affine_read_as_fp32_is_not_folded():
    """An fp32 affine chain whose consumer is not a SiLU casting back keeps its nodes (and its fp32 dtype)."""
    t, dtype = 9, torch.float16
    x = torch.randn(2, t, D).to(dtype)
    p = params(dtype)
    names = list(p)
    gm = make_fx(lambda x, *ps: module_cuda_211(x, None, **dict(zip(names, ps)), silu=False),
                 tracing_mode="fake")(x, *p.values())
    expect = gm(x, *p.values())
    rewrite_graph(gm.graph, bake=False)
    gm.graph.lint()
    gm.recompile()
    dw = next(n for n in gm.graph.nodes if n.target == torch.ops.oasr.conv1d_depthwise.default)
    assert dw.args[5] == "none" and aten.reciprocal.default in calls(gm)
    out = gm(x, *p.values())
    assert out.dtype == torch.float32
    assert (out - expect).abs().max() / expect.abs().max() < 1e-2


def reference(x, keep, p):
    q = {k: v.double() for k, v in p.items()}
    y = F.glu(F.conv1d(x.double().transpose(1, 2), q["w1"], q["b1"]), dim=1)
    if keep is not None:
        y = y.masked_fill(~keep[:, None, :], 0.0)
    y = F.conv1d(y, q["wd"], q["bd"], padding=KW // 2, groups=D)
    y = (y - q["mean"][:, None]) / torch.sqrt(q["var"][:, None] + 1e-5) * q["gamma"][:, None] + q["beta"][:, None]
    y = F.silu(y)
    return F.conv1d(y, q["w2"], q["b2"]).transpose(1, 2)


def traced(x, keep, p):
    names = list(p)

    def fn(x, keep, *ps):
        return module(x, keep, **dict(zip(names, ps)))
    if keep is None:
        return make_fx(lambda x, *ps: fn(x, None, *ps), tracing_mode="fake")(x, *p.values())
    return make_fx(fn, tracing_mode="fake")(x, keep, *p.values())


def calls(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("t", [1, 7, 250])
def test_conv_module_runs_in_btc(dtype, masked, t):
    g = torch.Generator().manual_seed(t)
    x = torch.randn(2, t, D, generator=g).to(dtype)
    keep = (torch.arange(t)[None] < torch.tensor([t, max(t // 2, 1)])[:, None]) if masked else None
    p = params(dtype)
    gm = traced(x, keep, p)
    res = rewrite_graph(gm.graph, bake=False)
    gm.graph.lint()
    gm.recompile()
    assert [(s.family, s.op, s.n, s.k, s.m, s.config) for s in res.sites] == [
        ("gemm", "gemm", 2 * D, D, 2 * t, "auto"), ("conv1d", "conv1d_btc", D, KW, 2 * t, "auto"),
        ("gemm", "gemm", D, D, 2 * t, "auto")]
    assert res.sites[0].signature == f"gemm|op=gemm|dt={'fp16' if dtype == torch.float16 else 'bf16'}|N={2 * D}|K={D}"
    targets = calls(gm)
    assert aten.convolution.default not in targets
    assert targets.count(torch.ops.oasr.gemm.default) == 2
    dw = next(n for n in gm.graph.nodes if n.target == torch.ops.oasr.conv1d_depthwise.default)
    # without a mask the GLU runs in the depthwise op's prologue; with one, GLU + mask stay an elementwise node
    assert dw.args[-1] is (not masked) and (aten.glu.default in targets) is masked
    # no transpose is left on a value path: only the mask's (bool, [B, 1, T]) permute remains
    perms = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == aten.permute.default]
    assert all(n.meta["val"].dtype == torch.bool for n in perms), [n.format_node() for n in perms]
    out = gm(x, keep, *p.values()) if masked else gm(x, *p.values())
    ref = reference(x, keep, p)
    assert out.shape == ref.shape and out.is_contiguous()
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < 2e-2, err


def test_pointwise_on_packed_bct_stays_on_aten_with_reason():
    p = params(torch.float16)

    def fn(x, w, b):  # the [B, C, T] input is a real tensor, not a transposed [B, T, C] view
        return aten.convolution.default(x, w, b, [1], [0], [1], False, [0], 1)
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(2, D, 9).half(), p["w2"], p["b2"])
    res = rewrite_graph(gm.graph, bake=False)
    assert res.sites == [] and aten.convolution.default in calls(gm)
    assert len(res.skipped) == 1 and "not a transposed [B, T, C] view" in res.skipped[0][1]


@pytest.mark.parametrize("kwargs,why", [
    (dict(stride=[2]), "stride"),
    (dict(padding=[1]), "padding"),
    (dict(dtype=torch.float32), "dtype"),
    (dict(cout=12), "multiples of 8"),
])
def test_pointwise_sites_it_cannot_serve_are_recorded(kwargs, why):
    dtype = kwargs.get("dtype", torch.float16)
    cout = kwargs.get("cout", D)
    w = torch.randn(cout, D, 1).to(dtype)

    def fn(x, w):
        return aten.convolution.default(x.permute(0, 2, 1), w, None, kwargs.get("stride", [1]),
                                        kwargs.get("padding", [0]), [1], False, [0], 1)
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(2, 9, D).to(dtype), w)
    res = rewrite_graph(gm.graph, bake=False)
    assert res.sites == [] and aten.convolution.default in calls(gm)
    assert any(why in r for _, r in res.skipped), res.skipped


def test_pointwise_without_transpose_back_is_a_view_of_the_gemm():
    w = torch.randn(2 * D, D, 1).half()

    def fn(x, w):  # the [B, C, T] result is consumed as such (a sum over T): a permute view of the GEMM's output
        return aten.convolution.default(x.permute(0, 2, 1), w, None, [1], [0], [1], False, [0], 1).sum(2)
    x = torch.randn(3, 5, D).half()
    gm = make_fx(fn, tracing_mode="fake")(x, w)
    res = rewrite_graph(gm.graph, bake=False)
    gm.recompile()
    assert [s.family for s in res.sites] == ["gemm"] and not res.sites[0].bias
    ref = F.conv1d(x.double().transpose(1, 2), w.double()).sum(2)
    assert ((gm(x, w).double() - ref).abs().max() / ref.abs().max()) < 1e-2


def test_glu_elsewhere_keeps_its_transpose():
    def fn(x):  # a GLU over a transposed view that feeds no conv: left alone
        return aten.glu.default(x.permute(0, 2, 1), 1).sum()
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(2, 5, 8).half())
    rewrite_graph(gm.graph, bake=False)
    glu = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == aten.glu.default]
    assert len(glu) == 1 and glu[0].args[1] == 1


def test_example_conformer_conv_module_through_make_fx():
    """examples/conformer.py conv_impl="conv1d" traced as make_fx leaves it (undecomposed native_batch_norm): the
    two pointwise convs become GEMMs on [B, T, C], the depthwise conv + BatchNorm + SiLU one op in layout btc."""
    cfg = conformer.config_for("S", d_model=32, num_heads=2, conv_kernel=15, conv_impl="conv1d")
    torch.manual_seed(0)
    mod = conformer.Conv1dConvolutionModule(cfg).eval()
    with torch.no_grad():
        mod.conv_norm.running_mean.uniform_(-0.5, 0.5)
        mod.conv_norm.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 51, 32, dtype=torch.float16)
    with torch.no_grad():
        expect = mod(x.float())
    mod = mod.half()
    state = {**dict(mod.named_parameters()), **dict(mod.named_buffers())}
    gm = make_fx(lambda state, x: functional_call(mod, state, (x,)), tracing_mode="fake")(state, x)
    res = rewrite_graph(gm.graph, bake=False)
    gm.recompile()
    assert [(s.family, s.op, s.n, s.k) for s in res.sites] == [
        ("gemm", "gemm", 64, 32), ("conv1d", "conv1d_btc", 32, 15), ("gemm", "gemm", 32, 32)]
    assert aten.convolution.default not in calls(gm) and res.skipped == []
    assert aten.glu.default not in calls(gm)  # in the depthwise op's prologue
    out = gm(state, x)
    err = (out.float() - expect).abs().max() / expect.abs().max()
    assert err < 2e-2, err


def test_example_linear_form_conv_module():
    """The Linear form (examples/conformer.py's default): Linear -> GLU(-1) -> transpose -> depthwise -> BatchNorm
    -> transpose -> SiLU -> Linear. The GLU runs in the depthwise op's prologue (layout btc) and the SiLU after the
    transpose back is fused too; the Linears are the gemm family's (not this family's) sites."""
    cfg = conformer.config_for("S", d_model=32, num_heads=2, conv_kernel=15)
    torch.manual_seed(1)
    mod = conformer.ConvolutionModule(cfg).eval()
    with torch.no_grad():
        mod.conv_norm.running_mean.uniform_(-0.5, 0.5)
        mod.conv_norm.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 23, 32, dtype=torch.float16)
    with torch.no_grad():
        expect = mod(x.float())
    mod = mod.half()
    state = {**dict(mod.named_parameters()), **dict(mod.named_buffers())}
    gm = make_fx(lambda state, x: functional_call(mod, state, (x,)), tracing_mode="fake")(state, x)
    res = rewrite_graph(gm.graph, bake=False)
    gm.recompile()
    dw = [s for s in res.sites if s.family == "conv1d"]
    assert [(s.op, s.activation) for s in dw] == [("conv1d_btc", "silu")]
    # conv1d's matcher runs before gemm's (rewrite_order): the second Linear then reads the depthwise op's packed
    # [B, T, C] output instead of a transposed view, so it is rewritten too (it used to stay on aten: "input not
    # known to be contiguous")
    assert sorted((s.family, s.n, s.k) for s in res.sites if s.family == "gemm") == [("gemm", 32, 32),
                                                                                    ("gemm", 64, 32)]
    assert res.skipped == []
    targets = calls(gm)
    assert aten.glu.default not in targets and aten.silu.default not in targets
    assert aten.convolution.default not in targets
    out = gm(state, x)
    err = (out.float() - expect).abs().max() / expect.abs().max()
    assert err < 2e-2, err


def test_symbolic_frames():
    """A dynamic-shape trace (symbolic B and T): the sites record a symbolic M and the graph runs at any T."""
    p = params(torch.float16)  # constants of the trace (get_attr, static shapes), as parameters are under Inductor
    gm = make_fx(lambda x: module(x, None, **p), tracing_mode="symbolic", _allow_non_fake_inputs=True)(
        torch.randn(2, 9, D).half())
    res = rewrite_graph(gm.graph, bake=False)
    gm.graph.lint()
    gm.recompile()
    assert [(s.family, s.m) for s in res.sites] == [("gemm", None), ("conv1d", None), ("gemm", None)], res.skipped
    for b, t in ((1, 5), (3, 13)):
        x = torch.randn(b, t, D).half()
        ref = reference(x, None, p)
        err = (gm(x).double() - ref).abs().max() / ref.abs().max()
        assert err < 2e-2, (b, t, err)
