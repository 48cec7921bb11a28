"""The conv2d op: `oasr::conv2d_activation(Tensor x, Tensor w, Tensor? bias, int[2] stride, int[2] padding,
str activation, str config) -> Tensor`.

``F.conv2d`` + activation in NHWC, for a speech frontend (``Conv2dSubsampling``: Conv2d(1, C, 3, stride 2) -> ReLU
-> Conv2d(C, C, 3, stride 2) -> ReLU):

* x: ``[B, H, W, Cin]`` fp16/bf16 (NHWC: channels contiguous). For Cin = 1 that is the same memory as the NCHW
  ``[B, 1, H, W]`` of ``feats.unsqueeze(1)``. A non-contiguous x is copied first (correct, one extra copy).
* w: ``[Cout, KH, KW, Cin]`` (KRSC: ``conv.weight.permute(0, 2, 3, 1)``), x's dtype; bias ``[Cout]`` or None.
* stride, padding: two ints each (H, W); dilation 1, groups 1.
* activation: ``none`` | ``relu`` | ``silu`` | ``gelu`` (erf).
* out: ``[B, Ho, Wo, Cout]`` packed NHWC, ``Ho = (H + 2 ph - KH) // sh + 1`` (likewise Wo).

Numerics: fp32 accumulation of bias + the conv, the activation in fp32, one rounding to x's dtype (the CPU
reference does exactly that with F.conv2d in fp32).

Selection (``config="auto"``): DB family ``conv2d_activation``, signature
``conv2d_activation|op=<op>|dt=half|N=<Cout>|K=<Cin*KH*KW>`` with regions over M = B * Ho * Wo; the op names the
filter geometry K leaves open: ``conv2d_k3s2`` (3x3, stride 2: the subsampling convs), ``conv2d_k3s1`` (3x3,
stride 1), ``conv2d`` (any other). Padding is not in the key (it only changes the border).
Untuned (policy ``heuristic``, `untuned_config`): the direct kernel's default for K <= 36 (a few input channels
under a 3x3 filter, the frontend's first conv: cuDNN's kernel plus a separate ReLU pass there cost ~410 us per
Conformer-M call on the H200, the direct kernel 250-265 us); for everything else the ``fused`` arm on sm90 (cuDNN's
conv + bias + ReLU fusion: measured faster than the plain cuDNN arm, whose bias add and ReLU are two extra passes,
and than every CUTLASS tile at all 12 frontend shapes) and ``torch`` (cuDNN) on other GPUs until measured.
The ``torch`` arm: ``F.conv2d`` on channels_last views (cuDNN's NHWC kernel; no layout conversion) and the
activation in place. The ``fused`` sentinel: cuDNN's conv + bias + ReLU fusion (``torch.cudnn_convolution_relu``)
for ReLU, the torch arm otherwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..autograd import register_inference_op
from ...configs import Config, Lane
from ...runtime import database as _database
from ...runtime.plans import PlanCache, WarnOnce, make_plan
from ...runtime.plans import check_config_arg as _check_config_arg
from ...runtime.plans import lane_check
from .lanes import DIRECT_LARGE

FAMILY = "conv2d_activation"
OP = "conv2d_activation"
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "silu": 3}  # the launchers' act codes (_epilogue.cuh.j2)
_ACT_NAMES = {v: k for k, v in ACTIVATIONS.items()}
DIRECT_MAX_K = 36  # the untuned rule serves the direct kernel up to 4 input channels under a 3x3 filter
# From this many output positions on, the untuned rule serves K = 9 (the 3x3, Cin = 1 first conv: the direct
# kernel's tensor-core path) with `lanes.DIRECT_LARGE`: 1.39-1.47x the default tile at M = 155k-467k positions on
# the H200, but 1.2-1.7x slower at M <= 1.2k (fewer CTAs); nothing was measured in between (docs/perf/conv.md).
DIRECT_LARGE_M = 1 << 17
DIRECT_LARGE_MEASURED = frozenset({"sm90"})  # arch families where that was measured

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("conv2d_activation(Tensor x, Tensor w, Tensor? bias, int[2] stride, int[2] padding, str activation, "
            "str config) -> Tensor")


# ----------------------------------------------------------------------------------------------------------
# checks and geometry

def out_extent(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def db_op(kh: int, kw: int, stride: tuple[int, int]) -> str:
    """The DB op of a conv geometry (module docstring)."""
    if (kh, kw) == (3, 3) and tuple(stride) in ((1, 1), (2, 2)):
        return f"conv2d_k3s{stride[0]}"
    return "conv2d"


def _pair(v, label: str, name: str = f"oasr.{OP}") -> tuple[int, int]:
    if isinstance(v, int):
        v = (v, v)
    try:
        a, b = v
        return int(a), int(b)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {label} must be two ints (H, W), got {v!r}") from None


def check(x, w, bias, stride, padding, activation) -> tuple[int, int]:
    """ValueError naming the problem; returns (Ho, Wo)."""
    name = f"oasr.{OP}"
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"{name}: x and w must be tensors")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ValueError(f"{name}: bias must be a tensor or None")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    if x.dtype not in DTYPES:
        raise ValueError(f"{name}: x has dtype {x.dtype}; supported: float16, bfloat16")
    check_layouts(name, x, w)
    for label, t in (("w", w), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise ValueError(f"{name}: {label} has dtype {t.dtype}; it must be x's {x.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: {label} is on device {t.device}, x on {x.device}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"{name}: bias must be [Cout] = [{w.shape[0]}], got {tuple(bias.shape)}")
    return check_geometry(name, x, w, stride, padding)


def check_layouts(name: str, x, w) -> None:
    """x 4-D NHWC and w 4-D KRSC with the same input channels (ValueError naming the problem)."""
    if x.dim() != 4:
        raise ValueError(f"{name}: x must be 4-D NHWC [B, H, W, Cin], got {tuple(x.shape)}")
    if w.dim() != 4:
        raise ValueError(f"{name}: w must be 4-D KRSC [Cout, KH, KW, Cin], got {tuple(w.shape)}")
    if w.shape[3] != x.shape[3]:
        raise ValueError(f"{name}: w {tuple(w.shape)} has {w.shape[3]} input channels (last dim, KRSC), "
                         f"x {tuple(x.shape)} has {x.shape[3]} (last dim, NHWC)")


def check_geometry(name: str, x, w, stride, padding) -> tuple[int, int]:
    """Stride and padding valid and an output of at least 1x1 (ValueError naming the problem); returns (Ho, Wo)."""
    sh, sw = _pair(stride, "stride", name)
    ph, pw = _pair(padding, "padding", name)
    if sh < 1 or sw < 1:
        raise ValueError(f"{name}: stride must be positive, got {(sh, sw)}")
    if ph < 0 or pw < 0:
        raise ValueError(f"{name}: padding must be >= 0, got {(ph, pw)}")
    ho = out_extent(x.shape[1], w.shape[1], sh, ph)
    wo = out_extent(x.shape[2], w.shape[2], sw, pw)
    if ho < 1 or wo < 1:
        raise ValueError(f"{name}: x {tuple(x.shape)} is smaller than the {w.shape[1]}x{w.shape[2]} filter "
                         f"with padding {(ph, pw)} (output {ho}x{wo})")
    return ho, wo


_IN_A_LANE = lane_check(FAMILY)  # check_config_arg's check_id: one function object (its memo key)


def check_config_arg(config: str) -> None:
    """ValueError unless `config` is auto, a sentinel, a conv2d lane's config id or a region table of those."""
    _check_config_arg(config, OP, _IN_A_LANE)


# Arch families where cuDNN's conv + bias + ReLU fusion (the ``fused`` arm) was measured faster than the plain
# cuDNN arm and every CUTLASS tile for the C -> C convs (H200: all 12 frontend shapes, docs/perf/conv.md).
FUSED_MEASURED = frozenset({"sm90"})


def untuned_config(lane: Lane, m: int, n: int, k: int, arch: str) -> str:
    """The ``heuristic`` policy (module docstring): the direct kernel's default for K <= 36 where it is feasible
    (`lanes.DIRECT_LARGE` for K = 9 from `DIRECT_LARGE_M` positions on);
    otherwise ``fused`` (cuDNN conv + bias + ReLU in one call; other activations run the torch arm) where it was
    measured (`FUSED_MEASURED`), else ``torch``."""
    if k <= DIRECT_MAX_K and lane.infeasible_reason(lane.default, n=n, k=k, arch_family=arch) is None:
        if (k == 9 and m >= DIRECT_LARGE_M and arch in DIRECT_LARGE_MEASURED and DIRECT_LARGE in lane.space
                and lane.infeasible_reason(DIRECT_LARGE, n=n, k=k, arch_family=arch) is None):
            return DIRECT_LARGE.id
        return lane.default.id
    return "fused" if arch in FUSED_MEASURED else "torch"


def untuned_ids(lane: Lane) -> tuple[str, ...]:
    """Every kernel config `untuned_config` can answer on `lane` (the spec's `production_extras`): the lane default
    and, where it was measured, `lanes.DIRECT_LARGE` — a large frontend (B=16 x 20 s: ~640k positions) runs it, so a
    prebuilt service must hold it."""
    ids = [lane.default.id]
    if DIRECT_LARGE in lane.space and any(a in DIRECT_LARGE_MEASURED for a in lane.arch_families):
        ids.append(DIRECT_LARGE.id)
    return tuple(ids)


# ----------------------------------------------------------------------------------------------------------
# reference (CPU), torch path and fake

def _activate(y: torch.Tensor, activation: str, inplace: bool = False) -> torch.Tensor:
    if activation == "relu":
        return torch.relu_(y) if inplace else torch.relu(y)
    if activation == "silu":
        return F.silu(y, inplace=inplace)
    if activation == "gelu":
        return F.gelu(y)
    return y


def reference_conv2d_fp32(x, w, bias, stride, padding, activation) -> torch.Tensor:
    """act(F.conv2d + bias) in fp32 from NHWC x / KRSC w: [B, Cout, Ho, Wo] (NCHW), not rounded."""
    y = F.conv2d(x.float().permute(0, 3, 1, 2), w.float().permute(0, 3, 1, 2),
                 None if bias is None else bias.float(), stride=tuple(stride), padding=tuple(padding))
    return _activate(y, activation)


def reference_conv2d(x, w, bias, stride, padding, activation):
    """fp32 F.conv2d + activation, one rounding to x's dtype; NHWC in, packed NHWC out."""
    y = reference_conv2d_fp32(x, w, bias, stride, padding, activation)
    return y.to(x.dtype).permute(0, 2, 3, 1).contiguous()


def torch_conv2d(x, w, bias, stride, padding, activation):
    """The ``torch`` arm: F.conv2d on channels_last views in x's dtype (cuDNN's NHWC kernel: no layout conversion
    on either side), the activation in place; returns the packed NHWC output."""
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), bias, stride=tuple(stride), padding=tuple(padding))
    y = _activate(y, activation, inplace=True)
    out = y.permute(0, 2, 3, 1)
    return out if out.is_contiguous() else out.contiguous()


def fused_conv2d(x, w, bias, stride, padding, activation):
    """The ``fused`` sentinel: cuDNN's conv + bias + ReLU fusion (``torch.cudnn_convolution_relu``, channels_last
    in and out) for ``relu``; the ``torch`` arm for every other activation. Packed NHWC out."""
    if activation != "relu" or not x.is_cuda:
        return torch_conv2d(x, w, bias, stride, padding, activation)
    y = torch.cudnn_convolution_relu(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), bias, list(stride), list(padding),
                                     [1, 1], 1)
    out = y.permute(0, 2, 3, 1)
    return out if out.is_contiguous() else out.contiguous()


def _cpu(x, w, bias, stride, padding, activation, config):
    check(x, w, bias, stride, padding, activation)
    check_config_arg(config)
    return reference_conv2d(x, w, bias, stride, padding, activation)


def _fake(x, w, bias, stride, padding, activation, config):
    ho, wo = check(x, w, bias, stride, padding, activation)
    check_config_arg(config)
    return x.new_empty((x.shape[0], ho, wo, w.shape[0]))


# ----------------------------------------------------------------------------------------------------------
# CUDA

_PLANS = PlanCache()
_plans = _PLANS.plans
_warn = WarnOnce()


def native_lane(arch: str):
    from ...runtime.registry import native_lane as _native

    return _native(arch, FAMILY)


def signature(op: str, cout: int, k: int) -> str:
    return _database.signature(FAMILY, op, "half", cout, k)


def packed_operands(x, w, bias):
    """(x, w, bias) contiguous, and whether all three start 16-byte aligned: the kernels' vector / TMA accesses need
    it; a view at an odd offset runs the torch arm instead (the same values)."""
    x = x if x.is_contiguous() else x.contiguous()
    w = w if w.is_contiguous() else w.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    return x, w, bias, (x.data_ptr() | w.data_ptr() | (0 if bias is None else bias.data_ptr())) % 16 == 0


def _kernel_run(cfg: Config, x, w, stride, padding, act: int, arch: str, sig: str, out_shape, quant: bool = False):
    """The launcher of `cfg` as ``run(x, w, bias)`` -> packed NHWC of x's dtype, or with `quant` (op
    conv2d_activation_quant, direct configs only) ``run(x, w, bias, out_scale)`` -> int8; None (warned once) where
    no kernel can serve."""
    from ...codegen.jit import BuildError, LoadError
    from .kernels import get_kernel

    name = f"oasr.{'conv2d_activation_quant' if quant else OP}"
    lane = native_lane(arch)
    if lane is None:
        _warn(f"{name}: no conv2d kernel lane runs on {arch}; F.conv2d serves {cfg.id}")
        return None
    if cfg not in lane.space:
        raise ValueError(f"{name}: config {cfg.id} is not in lane {lane.name}'s space {list(lane.ids())}")
    variant = DTYPES[x.dtype] + ("_q8" if quant else "")
    if quant and cfg.generation != "dc":
        _warn(f"{name}: {cfg.id} has no int8-output kernel (direct dc... configs only); F.conv2d then a separate "
              "quantization serves it")
        return None
    try:
        kern = get_kernel(lane, cfg, variant, arch)
    except (BuildError, LoadError) as e:
        _warn(f"{name}: kernel {cfg.id} ({variant}) unavailable, using F.conv2d: {e}")
        return None
    bsz, h, wd, cin = (int(s) for s in x.shape)
    cout, kh, kw = int(w.shape[0]), int(w.shape[1]), int(w.shape[2])
    (sh, sw), (ph, pw) = stride, padding
    shape = (bsz, h, wd, cin, cout, kh, kw, sh, sw, ph, pw, act)
    status = kern.can_implement(*shape)
    if status != 0:
        _warn(f"{name}: {cfg.id} rejects {sig} x={tuple(x.shape)} stride={tuple(stride)} (status {status}); "
              "using F.conv2d")
        return None
    ws_bytes = int(kern.workspace_size(*shape))
    run_c = kern.run
    raw_stream = torch._C._cuda_getCurrentRawStream

    if quant:
        def run_quant(x, w, bias, out_scale):
            x, w, bias, aligned = packed_operands(x, w, bias)
            if not aligned:
                return quantize_output(torch_conv2d(x, w, bias, stride, padding, _ACT_NAMES[act]), out_scale)
            out = torch.empty(out_shape, dtype=torch.int8, device=x.device)
            rc = run_c(x.data_ptr(), w.data_ptr(), None if bias is None else bias.data_ptr(), out_scale.data_ptr(),
                       out.data_ptr(), *shape, None, 0, raw_stream(x.get_device()))  # direct kernels: no workspace
            if rc != 0:
                raise RuntimeError(f"{name}: kernel {cfg.id} failed with status {rc} on x={tuple(x.shape)} "
                                   f"w={tuple(w.shape)} stride={tuple(stride)} padding={tuple(padding)}")
            return out
        return run_quant

    def run_kernel(x, w, bias):
        x, w, bias, aligned = packed_operands(x, w, bias)
        if not aligned:
            return torch_conv2d(x, w, bias, stride, padding, _ACT_NAMES[act])
        out = x.new_empty(out_shape)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device) if ws_bytes else None
        rc = run_c(x.data_ptr(), w.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(), *shape,
                   None if ws is None else ws.data_ptr(), ws_bytes, raw_stream(x.get_device()))
        if rc != 0:
            raise RuntimeError(f"oasr.{OP}: kernel {cfg.id} failed with status {rc} on x={tuple(x.shape)} "
                               f"w={tuple(w.shape)} stride={tuple(stride)} padding={tuple(padding)}")
        return out
    return run_kernel


def quantize_output(y: torch.Tensor, out_scale: torch.Tensor) -> torch.Tensor:
    """``clamp(rint(y * (1 / out_scale)), -127, 127)`` as int8 (op conv2d_activation_quant's output rule; the
    reciprocal in fp32, as the kernel computes it)."""
    inv = torch.reciprocal(out_scale.float()).reshape(())
    return torch.round(y.float() * inv).clamp_min(-127.0).clamp_max(127.0).to(torch.int8)


def _make_plan(config: str, x, w, stride, padding, activation: str, out_shape, quant: bool = False):
    """The plan of one call key; with `quant` its run takes and applies an out_scale (op conv2d_activation_quant)."""
    from ...runtime.arch import current_arch_family
    from ...runtime.select import serve_config

    bsz, ho, wo, cout = out_shape
    kh, kw, cin = int(w.shape[1]), int(w.shape[2]), int(w.shape[3])
    op, n, k, m = db_op(kh, kw, stride), cout, cin * kh * kw, bsz * ho * wo
    sig = signature(op, n, k)
    arch = current_arch_family() or "sm80"

    def torch_run(sentinel):
        arm = fused_conv2d if sentinel == "fused" else torch_conv2d
        if quant:
            return lambda x, w, bias, s: quantize_output(arm(x, w, bias, stride, padding, activation), s)
        return lambda x, w, bias: arm(x, w, bias, stride, padding, activation)

    return make_plan(FAMILY, config, m, n, k, arch, sig, keep_sentinel=True,
                     select=lambda: serve_config(FAMILY, op, x.dtype, n, k, m, arch),
                     torch_run=torch_run,
                     kernel_run=lambda cfg: _kernel_run(cfg, x, w, stride, padding, ACTIVATIONS[activation], arch,
                                                        sig, out_shape, quant))


def operand_key(x, w, bias) -> tuple:
    """What a plan key must hold of the operands so that a hit implies `check`'s operand rules (dtypes, shapes,
    devices; a bias of the wrong length or a weight of another dtype or device must not reach a kernel through a plan
    another call made). Layout needs no key: `packed_operands` packs a non-contiguous operand."""
    return (x.dtype, x.shape, x.device, w.dtype, w.shape, w.device,
            None if bias is None else (bias.dtype, bias.shape, bias.device))


def _cuda(x, w, bias, stride, padding, activation, config):
    key = (config, *operand_key(x, w, bias), tuple(stride), tuple(padding), activation, _database.epoch())
    plan = _plans.get(key)
    if plan is None:
        ho, wo = check(x, w, bias, stride, padding, activation)
        check_config_arg(config)
        out_shape = (int(x.shape[0]), ho, wo, int(w.shape[0]))
        if x.numel() == 0:
            return x.new_empty(out_shape)
        st, pd = _pair(stride, "stride"), _pair(padding, "padding")
        plan = _PLANS.get_or_make(key, lambda: _make_plan(config, x, w, st, pd, activation, out_shape))
    plan.calls += 1
    return plan.run(x, w, bias)


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)

served = _PLANS.served
reset_plans = _PLANS.clear


def conv2d_activation(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
                      stride: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0), activation: str = "none",
                      config: str = "auto") -> torch.Tensor:
    """NHWC ``F.conv2d`` + activation with a KRSC weight (module docstring)."""
    return torch.ops.oasr.conv2d_activation.default(x, w, bias, list(_pair(stride, "stride")),
                                                    list(_pair(padding, "padding")), activation, config)
