"""`oasr::layer_norm_quant`: LayerNorm over the last dim fused with symmetric per-token quantization.

``oasr::layer_norm_quant(Tensor x, Tensor? weight, Tensor? bias, float eps, bool normalized, str scheme,
str config) -> (Tensor q, Tensor scale, Tensor y)``
    x: ``[..., N]`` fp16 / bf16 (fp32 runs the reference everywhere), contiguous. weight, bias: ``[N]`` of x's
    dtype or fp32, or None. scheme: the quantization scheme, ``"int8"`` or ``"fp8"`` (e4m3, scale amax / 448:
    what `oasr::quantize_per_token_fp8` computes; the kernels are keyed by it). config: ``"auto"`` (the per-width
    table `AUTO_BY_WIDTH`) or an ``lnq_r{threads_per_row}_v{vec}`` id.
    Returns q (int8 or float8_e4m3fn, x's shape), scale (fp32 ``[M]``, M = x.numel() / N) and y: the normalized
    row in x's dtype when ``normalized`` (another consumer reads it), else an empty tensor (nothing written).

The formula (what the reference computes and the kernel reproduces; tolerances in tests/test_layer_norm_quant*.py)::

    y = round_to_x_dtype(layer_norm_fp32(x, weight, bias, eps))      # what the unfused LayerNorm writes
    scale = max(amax(|y|, -1), 1e-12) / 127;  q = clamp(round_half_even(y / scale), -127, 127)      # int8
    scale = max(amax(|y|, -1), 1e-12) / 448;  q = e4m3(clamp(y / scale, -448, 448))                 # fp8

i.e. exactly `oasr::quantize_per_token` (`_fp8`) of the unfused LayerNorm's output: fusing changes the passes over
memory, not the quantization. CPU (and fp32 input, and a width the kernel refuses) runs the reference; CUDA runs the
JIT-built kernel (templates/layer_norm_quant.cu.j2), which is CUDA-graph capturable (current stream, caching
allocator, no sync). The op is registered with a fake (shapes only) and refuses gradients. An int8 model compiled
with ``fuse_quantization=True`` calls it many times per forward (the example Conformer M: 64, four LayerNorms per
layer feed a quantized GEMM), so the C++ hot path (families/hot_path.py) serves its kernel launches without CUDA
graphs, from the plans made here (docs/perf/e2e.md, "layer_norm_quant on the C++ hot path").
"""
from __future__ import annotations

import math
import struct

import torch

from .. import hot_path as _hot
from ..autograd import register_inference_op
from ...codegen.render_layer_norm_quant import SCHEMES, SPACE, LnqConfig, parse_lnq  # noqa: F401
from ...runtime import database as _database
from ...runtime.plans import Plan, WarnOnce

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("layer_norm_quant(Tensor x, Tensor? weight, Tensor? bias, float eps, bool normalized, str scheme, "
            "str config) -> (Tensor, Tensor, Tensor)", tags=(torch.Tag.needs_fixed_stride_order,))

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_QMAX = {"int8": 127.0, "fp8": 448.0}
_QDTYPE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
# Width -> config, measured on the H200 (device step lnq-bench, benchmarks/logs/sm90_layer_norm_quant.json; CUDA
# graphs of 20 calls, fp16, M = 4000 and 16000): one warp per row (lnq_r32_v8) was the fastest or within 5 % at
# every measured width, 256..1024 (N=512, M=4000: 4.8 us; r64_v8 5.5, r128_v8 7.4, r256_v8 12.3). Wider rows than
# one warp holds (32 x 8 x 4 = 1024) were not measured: two warps per row up to 2048 (the same trend), then the
# 256-thread mapping.
AUTO_BY_WIDTH = ((1024, "lnq_r32_v8"), (2048, "lnq_r64_v8"), (8192, "lnq_r256_v8"))
_warn_once = WarnOnce()


def auto_config(n: int) -> LnqConfig | None:
    """The config "auto" serves for width n, None when no kernel holds such a row (the reference runs)."""
    for width, cid in AUTO_BY_WIDTH:
        if n <= width:
            return parse_lnq(cid)
    return None


def _check(x, weight, bias, eps, scheme, config) -> None:
    op = "oasr.layer_norm_quant"
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x must be a tensor [..., N] with N > 0")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{op}: x must be float16, bfloat16 or float32, got {x.dtype}")
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype not in (x.dtype, torch.float32):
            raise ValueError(f"{op}: {name} must have x's dtype ({x.dtype}) or float32, got {t.dtype}")
        if tuple(t.shape) != (n,):
            raise ValueError(f"{op}: {name} must have shape ({n},), got {tuple(t.shape)}")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device}, x on {x.device}")
    if not isinstance(eps, float) or not 0.0 <= eps < math.inf:
        raise ValueError(f"{op}: eps must be a finite float >= 0, got {eps!r}")
    if scheme not in SCHEMES or scheme not in _QMAX:
        raise ValueError(f"{op}: unknown scheme {scheme!r}; supported: {', '.join(_QMAX)}")
    if config != "auto":
        parse_lnq(config)


def _check_layout(x, weight, bias) -> None:
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"oasr.layer_norm_quant: {name} (shape {tuple(t.shape)}, stride {t.stride()}) is not "
                             "contiguous; call .contiguous() first")


def reference_layer_norm_quant(x, weight, bias, eps: float, normalized: bool, scheme: str = "int8"):
    """The op's formula in torch ops (fp32 LayerNorm, rounded to x's dtype, then per-token quantization)."""
    n = x.shape[-1]
    y = torch.nn.functional.layer_norm(x.float(), (n,), None if weight is None else weight.float(),
                                       None if bias is None else bias.float(), eps).to(x.dtype)
    yf = y.float().reshape(-1, n)
    qmax = _QMAX[scheme]
    scale = yf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / qmax
    if scheme == "fp8":  # e4m3: the cast rounds to nearest even; clamp first (the cast alone maps overflow to NaN)
        q = (yf / scale).clamp(-qmax, qmax).to(_QDTYPE[scheme]).reshape(x.shape)
    else:
        q = torch.round(yf / scale).clamp_min(-qmax).clamp_max(qmax).to(_QDTYPE[scheme]).reshape(x.shape)
    return q, scale.reshape(-1), (y if normalized else x.new_empty((0,)))


def _cpu(x, weight, bias, eps, normalized, scheme, config):
    _check(x, weight, bias, eps, scheme, config)
    _check_layout(x, weight, bias)
    return reference_layer_norm_quant(x, weight, bias, eps, normalized, scheme)


def _fake(x, weight, bias, eps, normalized, scheme, config):
    _check(x, weight, bias, eps, scheme, config)
    _check_layout(x, weight, bias)
    m = x.numel() // x.shape[-1]
    return (x.new_empty(x.shape, dtype=_QDTYPE[scheme]), x.new_empty((m,), dtype=torch.float32),
            x.new_empty(x.shape if normalized else (0,)))


# A call's launch decided once per (x, weight and bias metadata, eps, normalized, scheme, config): the checks, the
# config, the kernel load and its can_implement ran when it was decided (each ~2-10 us per call otherwise: a serving
# process calls this op dozens of times per forward). Value: the kernel's Plan, or None where the reference serves it.
_LAUNCHES: dict[tuple, Plan | None] = {}
_LAUNCHES_MAX = 4096  # distinct shapes; past it the cache starts over (a service sees a bounded set of lengths)


def _meta(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.dtype, t.shape, t.device, t.is_contiguous())


def _decide(x, weight, bias, eps, scheme, config) -> Plan | None:
    _check(x, weight, bias, eps, scheme, config)
    _check_layout(x, weight, bias)
    n = x.shape[-1]
    m = x.numel() // n
    cfg = auto_config(n) if config == "auto" else parse_lnq(config)
    if x.dtype == torch.float32 or m == 0 or cfg is None or n > cfg.max_width:
        return None
    from .kernels import get_kernel

    kern = get_kernel(cfg, x.dtype, scheme, x.device)
    if kern is None or kern.can_implement(m, n) != 0:
        return None
    return Plan(cfg.id, "width-table" if config == "auto" else "explicit", f"layer_norm_quant|N={n}",
                _kernel_run(cfg, kern))


def _kernel_run(cfg: LnqConfig, kern):
    """The launch of `cfg`'s kernel; ``.native`` tells the C++ hot path its launcher (no params)."""
    run_c = kern.run

    def run_kernel(x, weight, bias, eps, normalized, scheme):
        n = x.shape[-1]
        m = x.numel() // n
        q = torch.empty(x.shape, dtype=_QDTYPE[scheme], device=x.device)
        scale = torch.empty((m,), dtype=torch.float32, device=x.device)
        y = torch.empty_like(x) if normalized else x.new_empty((0,))
        rc = run_c(x.data_ptr(), None if weight is None else weight.data_ptr(), int(weight is not None
                   and weight.dtype == torch.float32), None if bias is None else bias.data_ptr(),
                   int(bias is not None and bias.dtype == torch.float32), q.data_ptr(), scale.data_ptr(),
                   y.data_ptr() if normalized else None, m, n, float(eps),
                   torch._C._cuda_getCurrentRawStream(x.get_device()))
        if rc == 1:  # a row the 1-element instantiation cannot hold (unaligned operands): the reference serves it
            _warn_once(f"oasr.layer_norm_quant: {cfg.id} cannot serve unaligned N={n}; using the reference for it")
            return reference_layer_norm_quant(x, weight, bias, eps, normalized, scheme)
        if rc != 0:
            raise RuntimeError(f"oasr.layer_norm_quant: kernel {cfg.id} failed with status {rc} on M={m} N={n}")
        return q, scale, y
    run_kernel.native = _hot.native_kernel(kern.handle.oasr_lnq_run)
    return run_kernel


_SCHEME_CODES = {"int8": 0, "fp8": 1}  # templates/hot_path.cpp layer_norm_quant_hit


def _hot_install(x, weight, bias, eps: float, normalized: bool, scheme: str, config: str, plan: Plan) -> None:
    """Install `plan` in the C++ hot path under the integers families/hot_path.py lists for this op."""
    code = _hot.dtype_code
    n = x.shape[-1]
    ints = (code(x.dtype), x.numel() // n, n, -1 if weight is None else code(weight.dtype),
            -1 if bias is None else code(bias.dtype), int(normalized), _SCHEME_CODES[scheme],
            struct.unpack("<q", struct.pack("<d", eps))[0], _hot.device_code(x.device))
    _hot.install("layer_norm_quant", config, ints, plan, _database.epoch())


def _cuda(x, weight, bias, eps, normalized, scheme, config):
    key = (*_meta(x), _meta(weight), _meta(bias), eps, normalized, scheme, config)
    try:
        plan = _LAUNCHES[key]
    except KeyError:
        plan = _decide(x, weight, bias, eps, scheme, config)
        if len(_LAUNCHES) >= _LAUNCHES_MAX:
            _LAUNCHES.clear()
        _LAUNCHES[key] = plan
    if plan is None:
        return reference_layer_norm_quant(x, weight, bias, eps, normalized, scheme)
    plan.calls += 1
    if _hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        _hot_install(x, weight, bias, eps, normalized, scheme, config, plan)
    return plan.run(x, weight, bias, eps, normalized, scheme)


register_inference_op(_lib, "layer_norm_quant", cpu=_cpu, cuda=_cuda, fake=_fake)


def layer_norm_quant(x, weight=None, bias=None, eps: float = 1e-5, normalized: bool = False,
                     scheme: str = "int8", config: str = "auto"):
    """(q, scale, y): LayerNorm of x's last dim quantized per token; y is empty unless `normalized`."""
    return torch.ops.oasr.layer_norm_quant.default(x, weight, bias, float(eps), bool(normalized), scheme, config)
