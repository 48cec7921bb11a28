"""The conv2d_activation family on the CPU: the NHWC op vs a float64 F.conv2d reference (odd sizes, strides,
padding, every activation), bad input, opcheck, the config grammar and lane, rendering, selection keys, the graph
rewrite (make_fx graphs and the example frontend through torch.compile), and the flatten permutation."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

import oasr_ops
from examples import conformer
from oasr_ops.configs import ConfigError, parse
from oasr_ops.families.conv2d_activation import candidates, ops
from oasr_ops.families.conv2d_activation.lanes import DIRECT_DEFAULT, DIRECT_LARGE, SM80_F16_CONV2D, SM90_F16_CONV2D
from oasr_ops.families.conv2d_activation.rewrite import rewrite
from oasr_ops.families.graph import RewriteContext, RewriteResult

aten = torch.ops.aten
OP = torch.ops.oasr.conv2d_activation.default
ACTS = {"none": lambda y: y, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu}


def make(b, h, w, cin, cout, k=3, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, w, cin, generator=g).to(dtype)
    wt = (torch.randn(cout, k, k, cin, generator=g) / (cin * k * k) ** 0.5).to(dtype)
    bias = torch.randn(cout, generator=g).to(dtype)
    return x, wt, bias


def reference64(x, w, b, stride, padding, act):
    """float64 NCHW F.conv2d of the NHWC/KRSC operands, back to NHWC (independent of the op's own path)."""
    y = F.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2),
                 None if b is None else b.double(), stride=stride, padding=padding)
    return ACTS[act](y).permute(0, 2, 3, 1)


def rel_err(a, r):
    return ((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-6)).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b,h,w,cin,cout,stride,padding", [
    (1, 3, 3, 1, 8, (2, 2), (0, 0)),      # one output position
    (2, 7, 80, 1, 16, (2, 2), (0, 0)),    # the frontend's first conv, odd T
    (3, 17, 39, 8, 16, (2, 2), (0, 0)),   # its second conv
    (1, 127, 11, 3, 8, (1, 1), (1, 1)),   # stride 1, same padding, 3 channels
    (2, 9, 13, 4, 24, (2, 1), (1, 0)),    # mixed stride / padding
])
@pytest.mark.parametrize("act", list(ACTS))
def test_op_matches_float64_reference(dtype, b, h, w, cin, cout, stride, padding, act):
    x, wt, bias = make(b, h, w, cin, cout, dtype=dtype)
    y = ops.conv2d_activation(x, wt, bias, stride=stride, padding=padding, activation=act)
    r = reference64(x, wt, bias, stride, padding, act)
    assert y.shape == r.shape and y.dtype == dtype and y.is_contiguous()
    assert rel_err(y, r) < 1e-2


def test_no_bias_and_noncontiguous_input():
    x, wt, _ = make(2, 11, 12, 8, 16)
    xs = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # same values, not packed
    assert not xs.is_contiguous()
    y = OP(xs, wt, None, [2, 2], [1, 1], "relu", "auto")
    assert rel_err(y, reference64(x, wt, None, (2, 2), (1, 1), "relu")) < 1e-2


@pytest.mark.parametrize("mutate,match", [
    (lambda x, w, b: (x.float(), w, b), "dtype"),
    (lambda x, w, b: (x[0], w, b), "4-D NHWC"),
    (lambda x, w, b: (x, w[:, :, :, :1].contiguous()[:, :, :, :0], b), "input channels"),
    (lambda x, w, b: (x, w.float(), b), "w has dtype"),
    (lambda x, w, b: (x, w, b[:3]), r"bias must be \[Cout\]"),
    (lambda x, w, b: (x, w[0], b), "4-D KRSC"),
])
def test_bad_input_names_the_problem(mutate, match):
    x, w, b = make(2, 9, 9, 8, 16)
    x2, w2, b2 = mutate(x, w, b)
    with pytest.raises(ValueError, match=match):
        OP(x2, w2, b2, [1, 1], [0, 0], "relu", "auto")


def test_bad_geometry_activation_and_config():
    x, w, b = make(1, 5, 5, 8, 16)
    with pytest.raises(ValueError, match="stride must be positive"):
        OP(x, w, b, [0, 1], [0, 0], "relu", "auto")
    with pytest.raises(ValueError, match="padding must be >= 0"):
        OP(x, w, b, [1, 1], [-1, 0], "relu", "auto")
    with pytest.raises(ValueError, match="smaller than"):
        OP(x[:, :2], w, b, [1, 1], [0, 0], "relu", "auto")
    with pytest.raises(ValueError, match="activation"):
        OP(x, w, b, [1, 1], [0, 0], "tanh", "auto")
    with pytest.raises(ValueError, match="no conv2d_activation lane"):
        OP(x, w, b, [1, 1], [0, 0], "relu", "dw64x32_v8_n128")
    with pytest.raises(ValueError, match="unknown config"):
        OP(x, w, b, [1, 1], [0, 0], "relu", "nope")


def test_opcheck():
    x, w, b = make(2, 9, 14, 8, 16)
    x1, w1, b1 = make(1, 7, 80, 1, 8)
    for args in ((x, w, b, [2, 2], [0, 0], "relu", "auto"), (x, w, None, [1, 1], [1, 1], "silu", "torch"),
                 (x1, w1, b1, [2, 2], [0, 0], "relu", DIRECT_DEFAULT.id)):
        torch.library.opcheck(OP, args)


def test_config_grammar_and_lane():
    c = parse("dc64x128_v8_n256")
    assert c.generation == "dc" and c.tile == (64, 128, 1) and c.alignment == 8 and c.threads == 256
    for bad in ("dc64x128_v8_n100", "dc64x100_v8_n256", "dc3x128_v8_n256", "dc64x128_v16_n256", "dc2x512_v8_n256"):
        with pytest.raises(ConfigError):
            parse(bad)
    ws = parse("t128x128x64_c2x1_ws")
    assert ws.generation == "3x" and ws.kernel_schedule == "warpspecialized" and ws.cluster == (2, 1, 1)
    with pytest.raises(ConfigError, match="one consumer warpgroup"):
        parse("t128x256x64_c1x1_ws")
    first, second = (512, 9), (512, 512 * 9)
    for lane, arch, gens in ((SM90_F16_CONV2D, "sm90", {"dc", "3x"}), (SM80_F16_CONV2D, "sm80", {"dc", "2x"})):
        assert lane.default == DIRECT_DEFAULT and len(lane.space) <= 12
        assert {c.generation for c in lane.space} == gens
        for c in lane.space:
            if c.generation == "dc":
                assert lane.infeasible_reason(c, n=first[0], k=first[1], arch_family=arch) is None
                assert "exceeds" in lane.infeasible_reason(c, n=second[0], k=second[1], arch_family=arch)
            else:
                assert lane.infeasible_reason(c, n=second[0], k=second[1], arch_family=arch) is None
                assert lane.infeasible_reason(c, n=first[0], k=first[1], arch_family=arch) is not None
    assert ops.native_lane("sm90") is SM90_F16_CONV2D and ops.native_lane("sm86") is SM80_F16_CONV2D


def test_render_every_config():
    from oasr_ops.codegen.render import render

    for lane in (SM90_F16_CONV2D, SM80_F16_CONV2D):
        for c in lane.space:
            for dt in ("fp16", "bf16"):
                src = render(lane, c, dt)
                assert "oasr_conv2d_run" in src and "oasr_conv2d_abi_version" in src
                assert ("conv2d_direct_kernel" in src) == (c.generation == "dc")
                assert ("DefaultConv2dFprop" in src) == (c.generation == "2x")
                assert ("KernelImplicitTmaWarpSpecializedSm90" in src) == (c.generation == "3x")
    with pytest.raises(ValueError):
        render(SM90_F16_CONV2D, parse("dw64x32_v8_n128"), "fp16")


def test_db_op_signature_and_untuned_rule():
    assert ops.db_op(3, 3, (2, 2)) == "conv2d_k3s2" and ops.db_op(3, 3, (1, 1)) == "conv2d_k3s1"
    assert ops.db_op(5, 5, (2, 2)) == "conv2d" and ops.db_op(3, 3, (2, 1)) == "conv2d"
    assert ops.signature("conv2d_k3s2", 512, 9) == "conv2d_activation|op=conv2d_k3s2|dt=half|N=512|K=9"
    lane = SM90_F16_CONV2D
    assert ops.untuned_config(lane, 10000, 512, 9, "sm90") == DIRECT_DEFAULT.id
    assert ops.untuned_config(lane, 10000, 512, 36, "sm90") == DIRECT_DEFAULT.id
    assert ops.untuned_config(lane, 10000, 512, 4608, "sm90") == "fused"  # measured on the H200
    assert ops.untuned_config(SM80_F16_CONV2D, 10000, 512, 4608, "sm86") == "torch"  # not measured there
    assert ops.untuned_config(lane, 10000, 12, 9, "sm90") == "fused"  # Cout not a whole number of vectors
    # the register path's large tile: 3x3 Cin = 1 (K = 9) from DIRECT_LARGE_M positions on, where measured
    big = ops.DIRECT_LARGE_M
    assert ops.untuned_config(lane, big, 512, 9, "sm90") == DIRECT_LARGE.id
    assert ops.untuned_config(lane, big - 1, 512, 9, "sm90") == DIRECT_DEFAULT.id
    assert ops.untuned_config(lane, big, 512, 36, "sm90") == DIRECT_DEFAULT.id  # the staged kernel: not measured
    assert ops.untuned_config(SM80_F16_CONV2D, big, 512, 9, "sm86") == DIRECT_DEFAULT.id  # not measured there
    from oasr_ops.runtime.select import serve_config

    assert serve_config("conv2d_activation", "conv2d_k3s2", "fp16", 512, 9, 5000, "sm90").config == DIRECT_DEFAULT.id
    assert serve_config("conv2d_activation", "conv2d_k3s2", "fp16", 512, 4608, 5000, "sm90").config == "fused"


def test_candidates_and_operands():
    from types import SimpleNamespace

    parts = SimpleNamespace(n=512, k=9)
    ids = [c.id for c in candidates.candidates(parts, "sm90")]
    assert ids[:3] == ["torch", "fused", DIRECT_DEFAULT.id] and all(i.startswith("dc") for i in ids[2:])
    ids2 = [c.id for c in candidates.candidates(SimpleNamespace(n=512, k=4608), "sm90")]
    assert ids2[:2] == ["torch", "fused"] and len(ids2) > 2 and all(i[0] in "bt" for i in ids2[2:])
    for op, n, k, m in (("conv2d_k3s2", 16, 9, 500), ("conv2d_k3s2", 16, 72, 77), ("conv2d_k3s1", 8, 72, 40)):
        point = SimpleNamespace(op=op, n=n, k=k, m=m, dtype="fp16")
        o = candidates.operands(point, "cpu", seed=1)
        cand = candidates.candidates(SimpleNamespace(n=n, k=k), "sm90")[0]
        out = cand.make_call(o)()
        ref = o.reference()
        assert out.shape == ref.shape and out.shape[1] * out.shape[2] >= m
        assert rel_err(out, ref) < 1e-2


# ----------------------------------------------------------------------------------------------- the rewrite

def frontend(c=16, d=24, mels=80):
    torch.manual_seed(0)
    return conformer.Conv2dSubsampling4(mels, c, d).eval().half()


def traced(module, x):
    names = [n for n, _ in module.named_parameters()]

    def f(x, *ps):
        return functional_call(module, dict(zip(names, ps)), (x,))

    ps = [p.detach() for p in module.parameters()]
    return make_fx(f, tracing_mode="fake")(x, *ps), ps


def run_rewrite(gm):
    res = RewriteResult()
    rewrite(RewriteContext(gm.graph, res, bake=False))
    gm.graph.lint()
    gm.recompile()
    return res


def calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


@pytest.mark.parametrize("frames", [7, 8, 100])
def test_frontend_graph_becomes_two_ops_and_a_free_flatten(frames):
    m = frontend()
    x = torch.randn(2, frames, 80, dtype=torch.float16)
    gm, ps = traced(m, x)
    res = run_rewrite(gm)
    assert [(s.op, s.n, s.k, s.activation, s.bias, s.config) for s in res.sites] == [
        ("conv2d_k3s2", 16, 9, "relu", True, "auto"), ("conv2d_k3s2", 16, 144, "relu", True, "auto")]
    t1 = ((frames - 1) // 2 - 1) // 2
    assert res.sites[0].m == 2 * ((frames - 1) // 2) * 39 and res.sites[1].m == 2 * t1 * 19
    assert res.sites[0].signature == "conv2d_activation|op=conv2d_k3s2|dt=fp16|N=16|K=9"
    assert not calls(gm, aten.convolution.default) and not calls(gm, aten.relu.default)
    op1, op2 = calls(gm, OP)
    assert op2.args[0] is op1  # the second conv reads the first's NHWC output directly
    # the flatten reads op2's NHWC output: no clone of an activation (only the weight's column permutation)
    for c in calls(gm, aten.clone.default):
        assert all(a.op == "placeholder" or a.target in (aten.permute.default, aten.view.default, aten.t.default)
                   for a in c.all_input_nodes)
        assert op2 not in c.all_input_nodes
    out = gm(x, *ps)
    with torch.no_grad():
        ref = m.double()(x.double())
    assert out.shape == ref.shape and rel_err(out, ref) < 1e-2


def test_flatten_stays_when_a_consumer_is_not_a_linear():
    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 8, 3, stride=2)

        def forward(self, x):
            y = torch.relu(self.conv(x.unsqueeze(1)))
            b, c, t, f = y.shape
            return y.transpose(1, 2).reshape(b, t, c * f).sum(-1)

    m = Probe().eval().half()
    x = torch.randn(2, 9, 20, dtype=torch.float16)
    gm, ps = traced(m, x)
    res = run_rewrite(gm)
    assert len(res.sites) == 1 and calls(gm, aten.clone.default)  # the (c, f) flatten still copies
    with torch.no_grad():
        ref = m.double()(x.double())
    assert rel_err(gm(x, *ps), ref) < 1e-2


@pytest.mark.parametrize("conv,reason", [
    (torch.nn.Conv2d(8, 8, 3), "NCHW tensor with 8 channels"),
    (torch.nn.Conv2d(1, 8, 3, dilation=2), "dilation"),
    (torch.nn.Conv2d(1, 8, 3, padding_mode="zeros", groups=1, bias=False), None),
])
def test_other_convs_are_left_with_a_reason(conv, reason):
    conv = conv.eval().half()
    cin = conv.in_channels
    x = torch.randn(2, cin, 11, 12, dtype=torch.float16)
    gm, ps = traced(conv, x)
    res = run_rewrite(gm)
    if reason is None:
        assert len(res.sites) == 1 and not res.sites[0].bias and res.sites[0].activation == "none"
        with torch.no_grad():
            ref = conv.double()(x.double())
        assert rel_err(gm(x, *ps), ref) < 1e-2
    else:
        assert not res.sites and len(res.skipped) == 1 and reason in res.skipped[0][1]
        assert calls(gm, aten.convolution.default)


def test_fp32_and_grouped_convs_are_left():
    conv = torch.nn.Conv2d(4, 8, 3, groups=2).eval()
    gm, _ = traced(conv, torch.randn(1, 4, 9, 9))
    res = run_rewrite(gm)
    assert not res.sites and "dtype" in res.skipped[0][1]
    gm, _ = traced(conv.half(), torch.randn(1, 4, 9, 9, dtype=torch.float16))
    res = run_rewrite(gm)
    assert not res.sites and "grouped" in res.skipped[0][1]


def test_flatten_permutation_is_the_same_dot_products():
    """Linear(x_(c,f)) == Linear'(x_(f,c)) with W' = W's columns in (f, c) order (rewrite.py's docstring)."""
    g = torch.Generator().manual_seed(3)
    b, t, f, c, d = 2, 5, 19, 6, 7
    y = torch.randn(b, t, f, c, generator=g, dtype=torch.float64)  # the NHWC conv output
    w = torch.randn(d, c * f, generator=g, dtype=torch.float64)
    ref = y.permute(0, 1, 3, 2).reshape(b, t, c * f) @ w.T  # the module: transpose(1, 2) of NCHW, (c, f) flatten
    w2 = w.view(d, c, f).permute(0, 2, 1).reshape(d, f * c)
    assert torch.allclose(y.reshape(b, t, f * c) @ w2.T, ref, rtol=0, atol=1e-12)


def test_compiled_frontend_on_cpu_uses_the_ops():
    """The real post-grad graph (torch.compile, backend oasr): two sites, numerics of the compiled module."""
    from oasr_ops.inductor import rewrite as rw
    from oasr_ops.inductor.backend import oasr_backend

    m = frontend(c=8, d=16)
    x = torch.randn(2, 41, 80, dtype=torch.float16)
    rw.clear_rewrite_log()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        torch._dynamo.reset()
        out = torch.compile(m, backend=oasr_backend, dynamic=False)(x)
        ref = m.double()(x.double())
    (res,) = rw.rewrite_log()
    assert [(s.family, s.op, s.k) for s in res.sites if s.family == "conv2d_activation"] == [
        ("conv2d_activation", "conv2d_k3s2", 9), ("conv2d_activation", "conv2d_k3s2", 72)]
    # the Linear after the free flatten (permuted weight) is still a gemm site: K = C x 19
    assert [(s.family, s.n, s.k) for s in res.sites if s.family == "gemm"] == [("gemm", 16, 8 * 19)]
    assert not any("weight is not" in why for _, why in res.skipped)
    assert out.shape == ref.shape and rel_err(out, ref) < 1e-2


# ---- nvcc --------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("cfg,dtype,arch", [("dc64x128_v8_n256", "fp16", "90"),
                                            ("b128x128x64_w64x64x64_s3", "bf16", "90"),
                                            ("t128x128x64_c2x1_ws", "fp16", "90a"),
                                            ("t64x256x64_c1x1_ws", "bf16", "90a")])
def test_nvcc_builds_and_exports_the_launcher(tmp_path, monkeypatch, cfg, dtype, arch):
    from oasr_ops.codegen.jit import JitSpec, nvcc_path
    from oasr_ops.families.conv2d_activation.kernels import load_kernel

    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    lane = SM90_F16_CONV2D if arch == "90a" else SM80_F16_CONV2D
    spec = JitSpec(lane, parse(cfg), dtype, arch)
    lib = load_kernel(spec)  # builds, dlopens (no GPU needed), checks both ABI versions
    assert lib.describe.startswith(f"{cfg}|{dtype}|{lane.name}|")
    first = (16, 1027, 80, 1, 512, 3, 3, 2, 2, 0, 0, 1)
    second = (16, 513, 39, 512, 512, 3, 3, 2, 2, 0, 0, 1)
    direct = cfg.startswith("dc")
    assert lib.can_implement(*first) == (0 if direct else 1)  # Cin = 1: the direct kernel only
    assert lib.can_implement(*second) == (1 if direct else 0)  # K = 4608: the implicit GEMM only
    assert lib.can_implement(*second[:-1], 4) == 1  # no such activation
    assert lib.can_implement(0, *second[1:]) == 1
    assert lib.can_implement(1, 2, 2, *second[3:]) == 1  # smaller than the filter
    assert lib.workspace_size(*(first if direct else second)) == 0
    assert "error" not in spec.log_path.read_text().lower()
    ctypes.CDLL(str(lib.path)).oasr_conv2d_abi_version()


def test_compiled_frontend_with_dynamic_shapes():
    """Symbolic B and T: the sites bake region tables, the shape queries of the replaced convs move to the ops'
    views (no convolution left behind for a `sym_size`), numerics at two shapes of one compiled graph."""
    from oasr_ops.inductor import rewrite as rw
    from oasr_ops.inductor.backend import oasr_backend

    m = frontend(c=8, d=16)
    rw.clear_rewrite_log()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        torch._dynamo.reset()
        fn = torch.compile(m, backend=oasr_backend, dynamic=True)
        for b, t in ((2, 41), (3, 57)):
            x = torch.randn(b, t, 80, dtype=torch.float16)
            out = fn(x)
            ref = m.double()(x.double())
            m.half()
            assert out.shape == ref.shape and rel_err(out, ref) < 1e-2
    log = rw.rewrite_log()
    assert log
    for res in log:
        convs = [s for s in res.sites if s.family == "conv2d_activation"]
        assert len(convs) == 2 and all(s.m is None and s.m_expr is not None for s in convs)
        assert not any("conv" in name for name, _ in res.skipped)  # nothing left for the conv1d matcher to skip
