"""Bad input to the public API gets a clear error (ValueError / TypeError naming the problem) on every path — the
CPU reference, the CUDA implementation's checks (called here with CPU tensors: they raise before anything runs on a
device) and the fake functions (so torch.compile refuses what the call would) — never an internal error, a silent
wrong result or a half-modified model."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import oasr_ops
from oasr_ops.runtime.registry import lanes

OPS = torch.ops.oasr


def _lane_ids(family: str) -> set[str]:
    return {c.id for lane in lanes().values() if lane.family == family for c in lane.space}


def _fake(*tensors: torch.Tensor) -> tuple:
    """FakeTensor copies (shape, dtype, strides) of `tensors` in a fresh mode, and the mode."""
    mode = FakeTensorMode()
    return mode, tuple(None if t is None else mode.from_tensor(t) for t in tensors)


# ---------------------------------------------------------------------------------------------- A1: conv out_scale

def _conv_operands():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 9, 9, 1, generator=g).half()
    w = (torch.randn(16, 3, 3, 1, generator=g) / 3).half()
    return x, w


@pytest.mark.parametrize("value", [0.0, float("nan"), -0.02, float("inf")])
def test_conv2d_activation_quant_refuses_a_non_positive_or_non_finite_out_scale(value):
    from oasr_ops.families.conv2d_activation import ops_quant

    x, w = _conv_operands()
    s = torch.tensor([value])
    with pytest.raises(ValueError, match="oasr.conv2d_activation_quant: out_scale must be finite and > 0"):
        oasr_ops.conv2d_activation_quant(x, w, s)
    # the CUDA implementation runs the same check (first call of a key, and a call with a plan: each call)
    with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
        ops_quant._cuda(x, w, None, [1, 1], [0, 0], "none", s, "auto")
    good = oasr_ops.conv2d_activation_quant(x, w, torch.tensor([0.02]))
    assert good.dtype == torch.int8 and good.shape == (1, 7, 7, 16)


def test_quantize_per_tensor_refuses_more_than_one_scale():
    x = torch.randn(2, 4, 4, 16)
    with pytest.raises(ValueError, match=r"oasr.quantize_per_tensor: scale must hold one value.*\(2,\)"):
        OPS.quantize_per_tensor(x, torch.tensor([0.1, 0.2]))
    mode, (fx, fs) = _fake(x, torch.tensor([0.1, 0.2]))
    with mode, pytest.raises(ValueError, match="scale must hold one value"):
        OPS.quantize_per_tensor(fx, fs)
    assert OPS.quantize_per_tensor(x, torch.tensor([0.1])).dtype == torch.int8


# ---------------------------------------------------------------------------------------------- A2: filter_fn first

class _Two(nn.Module):
    def __init__(self, layer) -> None:
        super().__init__()
        self.a, self.b = layer(), layer()


def _raise_on_b(_module, fqn):
    if fqn == "b":
        raise RuntimeError("filter failed")
    return True


@pytest.mark.parametrize("make,config,types", [
    (lambda: nn.Linear(64, 64), "int8_w8a8", (nn.Linear,)),
    (lambda: nn.Linear(64, 64), "fp8_w8a8", (nn.Linear,)),
    (lambda: nn.Conv2d(16, 16, 3), oasr_ops.Int8W8A8Config(), (nn.Conv2d,)),
])
def test_a_filter_fn_that_raises_leaves_the_model_unchanged(make, config, types):
    model = _Two(make)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(RuntimeError, match="filter failed"):
        oasr_ops.quantize_(model, config, filter_fn=_raise_on_b)
    assert type(model.a) in types and type(model.b) in types  # nothing swapped, not even the layer before "b"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    oasr_ops.quantize_(model, config)  # and it still quantizes
    assert type(model.a) not in types and type(model.b) not in types


def test_a_filter_fn_that_raises_on_a_conv_leaves_the_linears_too():
    """int8 with convs swaps the linears, then the convs: every answer is asked before the first swap."""
    model = nn.Module()
    model.a, model.b = nn.Linear(64, 64), nn.Conv2d(16, 16, 3)
    with pytest.raises(RuntimeError, match="filter failed"):
        oasr_ops.quantize_(model, oasr_ops.Int8W8A8Config(convs=True), filter_fn=_raise_on_b)
    assert type(model.a) is nn.Linear and type(model.b) is nn.Conv2d
    asked = []
    oasr_ops.quantize_(model, oasr_ops.Int8W8A8Config(convs=True),
                       filter_fn=lambda m, fqn: asked.append(fqn) or fqn == "b")  # the answers still apply
    assert type(model.a) is nn.Linear and type(model.b) is not nn.Conv2d and sorted(asked) == ["a", "b"]


# ---------------------------------------------------------------------------------------------- A3: config ids

_CONV1D_ID = sorted(_lane_ids("conv1d"))[0]


def _only_in(family: str, *others: str) -> str:
    """An id of `family`'s lanes that no lane of `others` holds."""
    other = set().union(*(_lane_ids(f) for f in others))
    return sorted(_lane_ids(family) - other)[0]


def _gemm_args():
    return torch.randn(4, 64).half(), torch.randn(32, 64).half()


def test_gemm_refuses_a_config_of_another_family_on_every_path():
    from oasr_ops.families.gemm import ops as gemm_ops

    a, w = _gemm_args()
    for config in (_CONV1D_ID, _only_in("scaled_mm", "gemm"), f"regions:16={_CONV1D_ID};*=torch"):
        with pytest.raises(ValueError, match=r"oasr.gemm: config .* is in no gemm lane"):
            oasr_ops.gemm(a, w, config=config)
        with pytest.raises(ValueError, match="is in no gemm lane"):
            gemm_ops._gemm_cuda(a, w, None, "none", config)  # what a GPU says (before any launch)
        mode, (fa, fw) = _fake(a, w)
        with mode, pytest.raises(ValueError, match="is in no gemm lane"):
            OPS.gemm(fa, fw, None, "none", config)


def test_gemm_keeps_accepting_every_gemm_lane_id_and_the_sentinels():
    a, w = _gemm_args()
    want = oasr_ops.gemm(a, w)
    ids = sorted(_lane_ids("gemm"))
    assert any(i.startswith("t") for i in ids) and any(i.startswith("b") for i in ids)  # sm90 and sm80 lanes
    for config in [*ids, "auto", "default", "torch", "fused", "heuristic", f"regions:16={ids[0]};*=torch"]:
        assert torch.equal(oasr_ops.gemm(a, w, config=config), want)


def _int8_args(n=32):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-8, 8, (4, 64), dtype=torch.int8, generator=g)
    w = torch.randint(-8, 8, (n, 64), dtype=torch.int8, generator=g)
    return a, w, torch.full((4,), 0.01), torch.full((n,), 0.02)


def test_the_int8_ops_refuse_a_config_of_another_family_and_name_their_op():
    from oasr_ops.families.scaled_mm import ops as smm_ops

    a, w, sa, sw = _int8_args()
    one = torch.ones(1)
    res = torch.zeros(4, 32, dtype=torch.float16)
    calls = {
        "scaled_mm": lambda c: oasr_ops.scaled_mm(a, w, sa, sw, config=c),
        "scaled_mm_quant": lambda c: oasr_ops.scaled_mm_quant(a, w, sa, sw, one, config=c),
        "scaled_mm_act_quant": lambda c: oasr_ops.scaled_mm_act_quant(a, w, sa, sw, one, "gelu", config=c),
        "scaled_mm_residual": lambda c: oasr_ops.scaled_mm_residual(a, w, sa, sw, res, config=c),
    }
    for config in (_only_in("gemm", "scaled_mm"), _CONV1D_ID):
        for op, call in calls.items():
            with pytest.raises(ValueError, match=rf"oasr.{op}: config .* is in no scaled_mm \(int8\) lane"):
                call(config)
        with pytest.raises(ValueError, match="is in no scaled_mm"):
            smm_ops._cuda("scaled_mm", a, w, sa, sw, None, torch.float16, None, config)
        mode, (fa, fw, fsa, fsw) = _fake(a, w, sa, sw)
        with mode, pytest.raises(ValueError, match="is in no scaled_mm"):
            OPS.scaled_mm(fa, fw, fsa, fsw, None, torch.float16, config)
    ids = sorted(_lane_ids("scaled_mm"))
    assert any(i.startswith("t") for i in ids) and any(i.startswith("b") for i in ids)  # sm90 and sm80 lanes
    want = oasr_ops.scaled_mm(a, w, sa, sw)
    for config in [*ids, "auto", "default", "torch", "heuristic"]:
        assert torch.equal(oasr_ops.scaled_mm(a, w, sa, sw, config=config), want)


def test_the_fp8_ops_refuse_a_config_of_another_family():
    from oasr_ops.families.scaled_mm_fp8 import ops as fp8_ops

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 64, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(32, 64, generator=g).to(torch.float8_e4m3fn)
    sa, sw, one = torch.full((4,), 0.01), torch.full((32,), 0.02), torch.ones(1)
    foreign = _only_in("gemm", "scaled_mm_fp8")
    for op, call in {"scaled_mm_fp8": lambda c: oasr_ops.scaled_mm_fp8(a, w, sa, sw, config=c),
                     "scaled_mm_fp8_quant": lambda c: oasr_ops.scaled_mm_fp8_quant(a, w, sa, sw, one, config=c),
                     "scaled_mm_fp8_act_quant":
                         lambda c: oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, one, "silu", config=c),
                     "scaled_mm_fp8_residual":
                         lambda c: oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, torch.zeros(4, 32, dtype=torch.bfloat16),
                                                                   config=c)}.items():
        with pytest.raises(ValueError, match=rf"oasr.{op}: config .* is in no scaled_mm_fp8 lane"):
            call(foreign)
    with pytest.raises(ValueError, match="is in no scaled_mm_fp8 lane"):
        fp8_ops._cuda("scaled_mm_fp8", a, w, sa, sw, None, torch.bfloat16, None, foreign)
    mode, (fa, fw, fsa, fsw) = _fake(a, w, sa, sw)
    with mode, pytest.raises(ValueError, match="is in no scaled_mm_fp8 lane"):
        OPS.scaled_mm_fp8(fa, fw, fsa, fsw, None, torch.bfloat16, foreign)
    want = oasr_ops.scaled_mm_fp8(a, w, sa, sw)
    for config in [*sorted(_lane_ids("scaled_mm_fp8")), "auto", "torch", "default", "heuristic"]:
        assert torch.equal(oasr_ops.scaled_mm_fp8(a, w, sa, sw, config=config), want)


def test_quantization_configs_check_their_kernel_field_up_front():
    with pytest.raises(ValueError, match=r"Int8W8A8Config.kernel: .* is in no scaled_mm \(int8\) lane"):
        oasr_ops.Int8W8A8Config(kernel=_only_in("gemm", "scaled_mm"))
    with pytest.raises(ValueError, match="Fp8W8A8Config.kernel: .* is in no scaled_mm_fp8 lane"):
        oasr_ops.Fp8W8A8Config(kernel=_only_in("gemm", "scaled_mm_fp8"))
    with pytest.raises(ValueError, match="Int8W8A8Config.kernel: .*unknown config"):
        oasr_ops.Int8W8A8Config(kernel="nonsense")
    for kernel in ("auto", "heuristic", "default", "torch", *sorted(_lane_ids("scaled_mm"))):
        assert oasr_ops.Int8W8A8Config(kernel=kernel).kernel == kernel
    for kernel in ("auto", "heuristic", "default", "torch", *sorted(_lane_ids("scaled_mm_fp8"))):
        assert oasr_ops.Fp8W8A8Config(kernel=kernel).kernel == kernel


# ---------------------------------------------------------------------------------------------- B4: backend options

@pytest.fixture
def no_inductor(monkeypatch):
    import torch._inductor.compile_fx as cfx

    monkeypatch.setattr(cfx, "compile_fx", lambda gm, example_inputs, config_patches=None: gm)
    return torch.fx.symbolic_trace(nn.Linear(8, 8)), [torch.randn(2, 8)]


def test_backend_names_an_unknown_option_key_and_the_valid_ones(no_inductor):
    from oasr_ops.inductor.backend import oasr_backend

    gm, x = no_inductor
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['fuse_quantisation'\] \(did you mean "
                                         r"'fuse_quantization'\?\).*'fuse_residual'.*torch._inductor.config"):
        oasr_backend(gm, x, options={"fuse_quantisation": True})
    with pytest.raises(ValueError, match="unknown mode 'turbo'; one of .*'reduce-overhead'"):
        oasr_backend(gm, x, options={"mode": "turbo"})
    with pytest.raises(ValueError, match="unknown mode 'turbo'"):
        oasr_backend(gm, x, mode="turbo")
    with pytest.raises(TypeError, match="options must be a dict, got list"):
        oasr_backend(gm, x, options=["x"])
    # the backend's own options and Inductor's config keys (forwarded as patches) still pass
    for options in ({"max_autotune": False}, {"triton.cudagraphs": False}, {"fuse_quantization": False},
                    {"mode": "max-autotune-no-cudagraphs"}, {"cpp_hot_path": True, "eager_regions": False}):
        oasr_backend(gm, x, options=options)


def test_torch_compile_with_an_unknown_option_says_which():
    from oasr_ops.inductor.backend import oasr_backend

    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown option.*fuse_quantisation") as ei:
        torch.compile(nn.Linear(8, 8), backend=oasr_backend, options={"fuse_quantisation": True})(torch.randn(2, 8))
    assert "ValueError" in repr(ei.value) or isinstance(ei.value, ValueError)


# ---------------------------------------------------------------------------------------------- B5: fake layouts

def _t(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view with t's shape and values."""
    return torch.stack([t, t], -1)[..., 0]


def _layout_cases() -> dict:
    a, w = _gemm_args()
    ia, iw, sa, sw = _int8_args()
    one = torch.ones(1)
    res = torch.zeros(4, 32, dtype=torch.float16)
    fa8, fw8 = ia.float().to(torch.float8_e4m3fn), iw.float().to(torch.float8_e4m3fn)
    x = torch.randn(4, 64).half()
    return {
        "gemm-a": (lambda a, w: OPS.gemm(a, w, None, "none", "auto"), (_t(a), w)),
        "gemm-w": (lambda a, w: OPS.gemm(a, w, None, "none", "auto"), (a, _t(w))),
        "scaled_mm-a": (lambda a, w, sa, sw: OPS.scaled_mm(a, w, sa, sw, None, torch.float16, "auto"),
                        (_t(ia), iw, sa, sw)),
        "scaled_mm-scale_w": (lambda a, w, sa, sw: OPS.scaled_mm(a, w, sa, sw, None, torch.float16, "auto"),
                              (ia, iw, sa, _t(sw))),
        "scaled_mm_quant-w": (lambda a, w, sa, sw, s: OPS.scaled_mm_quant(a, w, sa, sw, None, s, "auto"),
                              (ia, _t(iw), sa, sw, one)),
        "scaled_mm_act_quant-a": (lambda a, w, sa, sw, s: OPS.scaled_mm_act_quant(a, w, sa, sw, None, s, "gelu",
                                                                                  "auto"), (_t(ia), iw, sa, sw, one)),
        "scaled_mm_residual-residual": (
            lambda a, w, sa, sw, r: OPS.scaled_mm_residual(a, w, sa, sw, None, r, 1.0, torch.float16, "auto"),
            (ia, iw, sa, sw, _t(res))),
        "layer_norm_quant-x": (lambda x: OPS.layer_norm_quant(x, None, None, 1e-5, False, "int8", "auto"), (_t(x),)),
        "scaled_mm_fp8-a": (lambda a, w, sa, sw: OPS.scaled_mm_fp8(a, w, sa, sw, None, torch.bfloat16, "auto"),
                            (_t(fa8), fw8, sa, sw)),
        "scaled_mm_fp8_quant-w": (lambda a, w, sa, sw, s: OPS.scaled_mm_fp8_quant(a, w, sa, sw, None, s, "auto"),
                                  (fa8, _t(fw8), sa, sw, one)),
        "scaled_mm_fp8_act_quant-a": (
            lambda a, w, sa, sw, s: OPS.scaled_mm_fp8_act_quant(a, w, sa, sw, None, s, "gelu", "auto"),
            (_t(fa8), fw8, sa, sw, one)),
        "scaled_mm_fp8_residual-residual": (
            lambda a, w, sa, sw, r: OPS.scaled_mm_fp8_residual(a, w, sa, sw, None, r, 1.0, torch.float16, "auto"),
            (fa8, fw8, sa, sw, _t(res))),
    }


@pytest.mark.parametrize("case", list(_layout_cases()))
def test_the_fake_functions_refuse_what_the_real_ops_refuse_non_contiguous_operands(case):
    call, args = _layout_cases()[case]
    assert any(not t.is_contiguous() for t in args)
    with pytest.raises(ValueError, match="is not contiguous"):
        call(*args)  # the real op (CPU)
    mode, fargs = _fake(*args)
    with mode, pytest.raises(ValueError, match="is not contiguous"):
        call(*fargs)  # the fake: torch.compile refuses the call instead of compiling one that fails when run
    mode, fargs = _fake(*(t.contiguous() for t in args))
    with mode:
        call(*fargs)  # contiguous: the fake answers


# ---------------------------------------------------------------------------------------------- B6: empty conv1d

@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("t,c", [(0, 16), (5, 0)])
def test_conv1d_depthwise_with_no_frames_or_channels_returns_the_empty_output_on_the_cpu(layout, glu, t, c):
    cin = 2 * c if glu else c
    x = torch.randn((2, cin, t) if layout == "bct" else (2, t, cin)).half()
    w, b = torch.randn(c, 1, 3), torch.randn(c)
    out = oasr_ops.conv1d_depthwise(x, w, b, layout=layout, glu=glu)
    mode, (fx, fw, fb) = _fake(x, w, b)
    with mode:
        fake = oasr_ops.conv1d_depthwise(fx, fw, fb, layout=layout, glu=glu)
    assert out.shape == fake.shape == ((2, c, t) if layout == "bct" else (2, t, c)) and out.dtype == x.dtype


# ---------------------------------------------------------------------------------------------- B7: calibrate kwargs

class _ByKeyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(input=x)


def test_calibrate_sees_a_layer_called_with_a_keyword_argument():
    model = _ByKeyword()
    x = torch.randn(4, 64)
    got = oasr_ops.calibrate(model, [x])
    assert got == pytest.approx({"fc": float(x.abs().amax()) / 127})
    oasr_ops.quantize_(model)  # the quantized layer takes the same keyword call
    got = oasr_ops.calibrate(model, [x])
    assert got == pytest.approx({"fc": float(x.abs().amax()) / 127}) and model.fc.calibrated
    assert model(x).shape == (4, 64)


# ---------------------------------------------------------------------------------------------- B8: prewarm arguments

def test_prewarm_takes_what_the_backend_takes_for_tuning_and_refuses_the_rest():
    model = nn.Sequential(nn.Linear(64, 64))
    x = torch.randn(2, 64)
    with pytest.raises(TypeError, match="prewarm: tuning must be an oasr_ops.TuningConfig or a dict.*got str"):
        oasr_ops.prewarm(model, (x,), tuning="prewarm")
    with pytest.raises(TypeError, match="unexpected keyword argument 'moed'.*'mode'"):
        oasr_ops.prewarm(model, (x,), tuning={"moed": "prewarm"})
    with pytest.raises(ValueError, match="TuningConfig.mode"):
        oasr_ops.prewarm(model, (x,), tuning={"mode": "later"})
    assert oasr_ops.prewarm(model, (x,), tuning={"mode": "prewarm", "budget_s": 1}).uncovered == []
    with pytest.raises(TypeError, match=r"example_inputs must be a sequence of the model's inputs, e.g. \(x,\)"):
        oasr_ops.prewarm(model, x)


# ---------------------------------------------------------------------------------------------- B9: K = 0

@pytest.mark.parametrize("op", ["quantize_per_token", "quantize_per_token_fp8"])
@pytest.mark.parametrize("shape", [(4, 0), ()])
def test_per_token_quantization_needs_a_non_empty_last_dim(op, shape):
    x = torch.randn(shape)
    with pytest.raises(ValueError, match=rf"oasr.{op}: x must be \[..., K\] with K > 0"):
        getattr(OPS, op)(x)
    mode, (fx,) = _fake(x)
    with mode, pytest.raises(ValueError, match="K > 0"):
        getattr(OPS, op)(fx)
    q, s = getattr(OPS, op)(torch.randn(0, 16))  # no rows is fine
    assert q.shape == (0, 16) and s.shape == (0,)


# ---------------------------------------------------------------------------------------------- B10: quantize_ input

@pytest.mark.parametrize("config", ["int8_w8a8", "fp8_w8a8"])
def test_quantize_needs_a_module(config):
    for model in ("model", None):
        with pytest.raises(TypeError, match=f"quantize_: model must be a torch.nn.Module, got {type(model).__name__}"):
            oasr_ops.quantize_(model, config)


@pytest.mark.parametrize("config", ["int8_w8a8", "fp8_w8a8"])
def test_a_quantized_linear_names_the_width_it_expects(config):
    layer = oasr_ops.quantize_(nn.Linear(64, 64), config)
    with pytest.raises(ValueError, match=r"in_features=64\], got shape \(4, 32\)"):
        layer(torch.randn(4, 32))
    with pytest.raises(ValueError, match=r"in_features=64\], got shape \(\)"):
        layer(torch.tensor(1.0))
    assert layer(torch.randn(3, 64)).shape == (3, 64)


# ---------------------------------------------------------------------------------------------- C11: minor

@pytest.mark.parametrize("eps", [float("inf"), float("nan"), -1.0])
def test_layer_norm_quant_needs_a_finite_eps(eps):
    x = torch.randn(4, 64).half()
    with pytest.raises(ValueError, match="eps must be a finite float >= 0"):
        oasr_ops.layer_norm_quant(x, eps=eps)
    mode, (fx,) = _fake(x)
    with mode, pytest.raises(ValueError, match="eps must be a finite float >= 0"):
        oasr_ops.layer_norm_quant(fx, eps=eps)
    oasr_ops.layer_norm_quant(x, eps=0.0)  # the contract: >= 0


def test_boolean_tuning_switches_refuse_strings(tmp_path):
    with pytest.raises(ValueError, match="oasr.autotune: tune must be True or False, got 'no'"):
        oasr_ops.autotune(tune="no")
    with pytest.raises(ValueError, match="oasr.autotune: publish must be True or False"):
        oasr_ops.autotune(publish="no")
    with pytest.raises(ValueError, match="TuningConfig.strict must be True or False, got 'no'"):
        oasr_ops.TuningConfig(strict="no")
    assert not oasr_ops.autotune(tune=False).tune and oasr_ops.TuningConfig(strict=True).strict


def test_autotune_refuses_a_directory_as_its_cache_up_front(tmp_path):
    with pytest.raises(ValueError, match="cache .* is a directory; pass a JSON file path"):
        oasr_ops.autotune(cache=tmp_path)
    assert oasr_ops.autotune(cache=tmp_path / "tune.json").cache_path == tmp_path / "tune.json"


def test_act_quant_errors_name_their_own_op():
    a, w, sa, sw = _int8_args(n=24)
    with pytest.raises(ValueError, match=r"oasr.scaled_mm_act_quant: N=24 is not a multiple of 16"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.ones(1), "gelu")
    a, w, sa, sw = _int8_args()
    with pytest.raises(ValueError, match=r"oasr.scaled_mm_act_quant: out_scale must be finite"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.zeros(1), "gelu")
    with pytest.raises(ValueError, match=r"oasr.scaled_mm_act_quant: out_scale must have shape"):
        oasr_ops.scaled_mm_act_quant(a, w, sa, sw, torch.ones(3), "gelu")
    fa = torch.randn(4, 64).to(torch.float8_e4m3fn)
    fw = torch.randn(24, 64).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"oasr.scaled_mm_fp8_act_quant: N=24"):
        oasr_ops.scaled_mm_fp8_act_quant(fa, fw, sa, torch.ones(24), torch.ones(1), "gelu")
