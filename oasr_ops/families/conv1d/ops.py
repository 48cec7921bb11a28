"""The depthwise conv1d op: `oasr::conv1d_depthwise(Tensor x, Tensor w, Tensor? bias, int padding, str layout,
str activation, str config, bool glu=False) -> Tensor`.

``F.conv1d(x, w, bias, stride=1, padding=padding, groups=C)`` then the activation, for the Conformer's
depthwise conv (inference BatchNorm folded into ``w``/``bias`` by the caller, `fold_batchnorm`):

* x: fp16/bf16, ``layout="bct"``: ``[B, C, T]`` (PyTorch's conv layout) or ``layout="btc"``: ``[B, T, C]`` (the
  encoder's Linear layout: no transpose on either side of the conv). The output has x's shape, dtype and layout,
  packed. A non-contiguous x is copied to its layout's packed form first (correct, one extra copy).
* w: ``[C, 1, Kw]`` (nn.Conv1d's depthwise weight), Kw odd in 3..31; bias ``[C]`` or None. Each is fp32 (what a
  BatchNorm fold produces: no rounding of the folded weights) or x's dtype.
* padding must be ``Kw // 2`` ("same"); stride 1, dilation 1 (the schema mirrors F.conv1d's arguments so a bad
  site fails loudly instead of being silently reinterpreted).
* activation: ``none`` | ``silu``.
* glu: x has 2C channels and the conv reads ``F.glu(x, dim=<channel dim>)`` (a * sigmoid(g), a the first C
  channels), computed in fp32 as the kernel loads x — the Conformer's pointwise conv -> GLU -> depthwise conv
  without the GLU output ever being written. The output has C channels.

Numerics: fp32 accumulation of bias + sum_k w[c, k] * x[t - Kw//2 + k], the activation in fp32, one rounding to
x's dtype — the CPU reference computes exactly that with F.conv1d in fp32. Frames outside 0 <= t < T read as
zero, so padding frames never produce non-finite values (the example's masking relies on it).

Selection (``config="auto"``): the tuning DB's conv1d family, signature ``conv1d|op=<op>|dt=half|N=<C>|K=<Kw>``
— the spec's conv1d key (N = out channels, K = in channels per group x width = 1 x Kw for a depthwise conv) with
the layout as the op: ``conv1d`` ([B, C, T]) or ``conv1d_btc`` ([B, T, C]), since the best tile differs between
them (as bmm's B layout is its op). The spec's exact point ``"BxT"`` is tried first, then regions over
M = B * T (stride 1: T_out = T). Untuned: the lane default (policy ``default``): a direct kernel in the
activation's own layout reads and writes each element about once, where cuDNN's `conv1D_NCHW_general` plus its
NCHW<->NHWC conversions cost 1.5 ms per Conformer call on the H200 (profile of a 768-wide Conformer, docs/perf/conv.md);
benchmarks/conv1d.py measures the claim per shape.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from .. import hot_path as _hot
from ..autograd import register_inference_op
from ...configs import AUTO, DW_MAX_KW, Config, parse
from ...runtime import database as _database
from ...runtime.plans import TABLE_PREFIX as _TABLE_PREFIX
from ...runtime.plans import Plan, PlanCache, resolve_table
from ...runtime.plans import check_config_arg as _check_config_arg
from ...runtime.plans import lane_check

FAMILY = "conv1d"
OP = "conv1d_depthwise"
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
LAYOUTS = ("bct", "btc")
ACTIVATIONS = {"none": 0, "silu": 1}
DB_OP = {"bct": "conv1d", "btc": "conv1d_btc"}  # the DB op of each layout (module docstring)

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("conv1d_depthwise(Tensor x, Tensor w, Tensor? bias, int padding, str layout, str activation, "
            "str config, bool glu=False) -> Tensor")


# ----------------------------------------------------------------------------------------------------------
# checks

def _check(x, w, bias, padding, layout, activation, glu=False) -> None:
    name = f"oasr.{OP}"
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"{name}: x and w must be tensors")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ValueError(f"{name}: bias must be a tensor or None")
    if layout not in LAYOUTS:
        raise ValueError(f"{name}: layout must be one of {LAYOUTS}, got {layout!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    if x.dtype not in DTYPES:
        raise ValueError(f"{name}: x has dtype {x.dtype}; supported: float16, bfloat16")
    if x.dim() != 3:
        raise ValueError(f"{name}: x must be 3-D ([B, C, T] for layout bct, [B, T, C] for btc), got {tuple(x.shape)}")
    c = x.shape[1] if layout == "bct" else x.shape[2]
    if glu:
        if c % 2:
            raise ValueError(f"{name}: glu needs an even channel count (2C), x {tuple(x.shape)} in layout {layout}")
        c //= 2
    if w.dim() != 3 or w.shape[0] != c or w.shape[1] != 1:
        raise ValueError(f"{name}: w must be [C, 1, Kw] = [{c}, 1, Kw] for x {tuple(x.shape)} in layout {layout}, "
                         f"got {tuple(w.shape)}")
    kw = w.shape[2]
    if kw % 2 == 0 or not (3 <= kw <= DW_MAX_KW):
        raise ValueError(f"{name}: kernel width {kw} must be odd in 3..{DW_MAX_KW} ('same' padding)")
    if padding != kw // 2:
        raise ValueError(f"{name}: padding {padding} is not 'same' ({kw // 2} for kernel width {kw})")
    for label, t in (("w", w), ("bias", bias)):
        if t is None:
            continue
        if t.dtype not in (torch.float32, x.dtype):
            raise ValueError(f"{name}: {label} has dtype {t.dtype}; it must be float32 or x's {x.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: {label} is on device {t.device}, x on {x.device}")
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"{name}: bias must be [C] = [{c}], got {tuple(bias.shape)}")


_IN_A_LANE = lane_check(FAMILY)  # check_config_arg's check_id: one function object (its memo key)


def check_config_arg(config: str) -> None:
    """ValueError unless `config` is auto, a sentinel, a conv1d lane's config id or a region table of those."""
    _check_config_arg(config, OP, _IN_A_LANE)


def fold_batchnorm(w: torch.Tensor, b: torch.Tensor | None, bn) -> tuple[torch.Tensor, torch.Tensor]:
    """Inference BatchNorm after a conv, folded into it: ``bn(conv(x, w, b)) == conv(x, w', b')``, fp32.

    `bn` is an ``nn.BatchNorm1d`` in eval mode or a tuple ``(running_mean, running_var, weight, bias, eps)``
    (weight/bias may be None: affine=False). ``w' = w * g``, ``b' = (b - mean) * g + beta`` with
    ``g = weight / sqrt(var + eps)``. Returned in fp32 (the op takes fp32 weights without rounding them)."""
    if isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
        if bn.training or bn.running_mean is None:
            raise ValueError("fold_batchnorm: the BatchNorm must be in eval mode with running statistics")
        mean, var, gamma, beta, eps = bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps
    else:
        mean, var, gamma, beta, eps = bn
    c = w.shape[0]
    if mean.shape != (c,) or var.shape != (c,):
        raise ValueError(f"fold_batchnorm: BatchNorm has {tuple(mean.shape)} channels, the conv {c}")
    g = torch.rsqrt(var.float() + float(eps))
    if gamma is not None:
        g = g * gamma.float()
    w2 = w.float() * g.reshape(-1, *([1] * (w.dim() - 1)))
    b0 = b.float() if b is not None else torch.zeros(c, device=w.device)
    b2 = (b0 - mean.float()) * g + (beta.float() if beta is not None else 0.0)
    return w2, b2


# ----------------------------------------------------------------------------------------------------------
# reference (CPU), torch path and fake

def _activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    return F.silu(y) if activation == "silu" else y


def _out_shape(x, layout, glu):
    if not glu:
        return x.shape
    b, d1, d2 = x.shape
    return (b, d1 // 2, d2) if layout == "bct" else (b, d1, d2 // 2)


def reference_conv1d_depthwise(x, w, bias, padding, layout, activation, glu=False):
    """fp32 [GLU +] F.conv1d (groups = C) + activation, one rounding to x's dtype; in x's layout, packed."""
    xc = x.float() if layout == "bct" else x.float().transpose(1, 2)
    if glu:
        xc = F.glu(xc, dim=1)
    y = F.conv1d(xc, w.float(), None if bias is None else bias.float(), padding=padding, groups=w.shape[0])
    y = _activate(y, activation).to(x.dtype)
    return y if layout == "bct" else y.transpose(1, 2).contiguous()


def _torch_conv(x, w, bias, padding, layout, activation, glu=False):
    """The ``torch`` sentinel: [F.glu +] F.conv1d in x's dtype (cuDNN), with the layout conversions a [B, T, C]
    caller pays."""
    xc = x if layout == "bct" else x.transpose(1, 2)
    if glu:
        xc = F.glu(xc, dim=1)
    y = F.conv1d(xc, w.to(x.dtype), None if bias is None else bias.to(x.dtype), padding=padding, groups=w.shape[0])
    y = _activate(y, activation)
    return y.contiguous() if layout == "bct" else y.transpose(1, 2).contiguous()


def _cpu(x, w, bias, padding, layout, activation, config, glu=False):
    _check(x, w, bias, padding, layout, activation, glu)
    check_config_arg(config)
    if x.numel() == 0:  # T = 0 or C = 0 (F.conv1d refuses both): the empty output, as the fake and CUDA give
        return x.new_empty(_out_shape(x, layout, glu))
    return reference_conv1d_depthwise(x, w, bias, padding, layout, activation, glu)


def _fake(x, w, bias, padding, layout, activation, config, glu=False):
    _check(x, w, bias, padding, layout, activation, glu)
    check_config_arg(config)
    return x.new_empty(_out_shape(x, layout, glu))


# ----------------------------------------------------------------------------------------------------------
# CUDA

_PLANS = PlanCache()
_plans = _PLANS.plans
_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, stacklevel=4)


def native_lane(arch: str):
    from ...runtime.registry import native_lane as _native

    return _native(arch, FAMILY)


def signature(layout: str, c: int, kw: int) -> str:
    return _database.signature(FAMILY, DB_OP[layout], "half", c, kw)


def select_config(dtype: torch.dtype, layout: str, c: int, kw: int, batch: int, t: int, arch: str | None = None):
    """The tuning DB's answer for one depthwise conv: exact point ``BxT``, then regions over M = B * T."""
    from ...runtime.select import select_conv1d

    return select_conv1d(DB_OP[layout], DTYPES.get(dtype, dtype), c, kw, batch, t, t, arch)


def _kernel_run(cfg: Config, x: torch.Tensor, layout: str, kw: int, act: int, arch: str, sig: str, glu: bool):
    from ...codegen.jit import BuildError, LoadError
    from .kernels import get_kernel, variant_for

    lane = native_lane(arch)
    if lane is None:
        _warn_once(f"oasr.{OP}: no conv1d kernel lane runs on {arch}; F.conv1d serves {cfg.id}")
        return None
    if cfg not in lane.space:
        raise ValueError(f"oasr.{OP}: config {cfg.id} is not in lane {lane.name}'s space {list(lane.ids())}")
    variant = variant_for(x.dtype, layout)
    try:
        kern = get_kernel(lane, cfg, variant, arch)
    except (BuildError, LoadError) as e:
        _warn_once(f"oasr.{OP}: kernel {cfg.id} ({variant}) unavailable, using F.conv1d: {e}")
        return None
    bsz = x.shape[0]
    c, t = (x.shape[1], x.shape[2]) if layout == "bct" else (x.shape[2], x.shape[1])
    c //= 2 if glu else 1
    out_shape = _out_shape(x, layout, glu)
    status = kern.can_implement(bsz, t, c, kw, act, int(glu))
    if status != 0:
        _warn_once(f"oasr.{OP}: {cfg.id} rejects {sig} B={bsz} T={t} (status {status}); using F.conv1d")
        return None
    run_c = kern.run
    raw_stream = torch._C._cuda_getCurrentRawStream

    def run_kernel(x, w, bias):
        x = x.contiguous()
        w2 = w.reshape(c, kw)
        if not w2.is_contiguous():
            w2 = w2.contiguous()
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        out = x.new_empty(out_shape)
        rc = run_c(x.data_ptr(), w2.data_ptr(), int(w2.dtype == torch.float32),
                   None if bias is None else bias.data_ptr(), int(bias is not None and bias.dtype == torch.float32),
                   out.data_ptr(), bsz, t, c, kw, act, int(glu), None, 0, raw_stream(x.get_device()))
        if rc != 0:
            raise RuntimeError(f"oasr.{OP}: kernel {cfg.id} failed with status {rc} on B={bsz} T={t} C={c} Kw={kw}")
        return out
    run_kernel.native = _hot.native_kernel(kern.handle.oasr_dwconv_run, bsz, t, c, kw, act, int(glu))
    return run_kernel


def _make_plan(config: str, x, w, layout: str, activation: str, glu: bool) -> Plan:
    from ...runtime.arch import current_arch_family

    kw = w.shape[2]
    bsz = x.shape[0]
    c, t = w.shape[0], (x.shape[2] if layout == "bct" else x.shape[1])
    sig = signature(layout, c, kw)
    arch = current_arch_family() or "sm80"
    padding = kw // 2

    def torch_run(x, w, bias):
        return _torch_conv(x, w, bias, padding, layout, activation, glu)

    tier = "explicit"
    if config.startswith(_TABLE_PREFIX):
        config, tier = resolve_table(config, bsz * t), "baked"
    if config == AUTO:
        sel = select_config(x.dtype, layout, c, kw, bsz, t, arch)
        config, tier = sel.config, sel.tier
    if config == "default":
        lane = native_lane(arch)
        config = lane.default.id if lane is not None else "torch"
    if config in ("torch", "fused", "heuristic"):
        return Plan("torch", tier, sig, torch_run)
    cfg = parse(config)
    run = _kernel_run(cfg, x, layout, kw, ACTIVATIONS[activation], arch, sig, glu)
    if run is None:
        return Plan("torch", tier, sig, torch_run)
    return Plan(cfg.id, tier, sig, run)


def _cuda(x, w, bias, padding, layout, activation, config, glu=False):
    # Everything `_check` looks at is in the key (bias's shape and w's / bias's devices too: a bias shorter than C,
    # or a weight left on the CPU, must not reach the kernel through a plan another call made), so a hit skips it.
    key = (config, x.dtype, w.dtype, None if bias is None else (bias.dtype, bias.shape, bias.device), x.shape,
           w.shape, padding, layout, activation, glu, x.device, w.device, _database.epoch())
    plan = _plans.get(key)
    if plan is None:
        _check(x, w, bias, padding, layout, activation, glu)
        check_config_arg(config)
        if x.numel() == 0:
            return x.new_empty(_out_shape(x, layout, glu))
        plan = _PLANS.get_or_make(key, lambda: _make_plan(config, x, w, layout, activation, glu))
    plan.calls += 1
    if _hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        _hot_install(key, plan)
    return plan.run(x, w, bias)


def _hot_install(key: tuple, plan: Plan) -> None:
    """Install `plan` in the C++ hot path under `_cuda`'s `key`, as the integers families/hot_path.py lists."""
    config, x_dtype, w_dtype, bias, x_shape, w_shape, padding, layout, activation, glu, x_dev, w_dev, epoch = key
    code = _hot.dtype_code
    ints = [code(x_dtype), code(w_dtype)]
    ints += [-1] if bias is None else [code(bias[0]), len(bias[1]), *bias[1], _hot.device_code(bias[2])]
    ints += [len(x_shape), *x_shape, len(w_shape), *w_shape, padding, LAYOUTS.index(layout), ACTIVATIONS[activation],
             int(glu), _hot.device_code(x_dev), _hot.device_code(w_dev)]
    _hot.install("conv1d_depthwise", config, tuple(ints), plan, epoch)


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)

served, reset_plans = _hot.plan_cache_functions(_PLANS)


def conv1d_depthwise(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, layout: str = "bct",
                     activation: str = "none", config: str = "auto", glu: bool = False) -> torch.Tensor:
    """Depthwise ``F.conv1d(x, w, bias, padding=Kw // 2, groups=C)`` + activation, of ``F.glu(x)`` over the
    channels with `glu` (module docstring)."""
    return torch.ops.oasr.conv1d_depthwise.default(x, w, bias, w.shape[-1] // 2, layout, activation, config, glu)
