"""oasr_ops: per-shape, per-architecture CUTLASS GEMM selection from measured data, served as torch ops."""
from __future__ import annotations

import os as _os

from ._version import __version__  # noqa: E402,F401

from . import families  # noqa: F401,E402  (registers every kernel family and its torch.ops.oasr.* ops)
from .configs import SENTINELS, Config, parse  # noqa: F401,E402
from .families.bmm.ops import bmm  # noqa: F401,E402
from .families.conv1d.ops import conv1d_depthwise, fold_batchnorm  # noqa: F401,E402
from .families.conv2d_activation.ops import conv2d_activation  # noqa: F401,E402
from .families.conv2d_activation.ops_int8 import conv2d_int8_activation, quantize_conv_weight  # noqa: F401,E402
from .families.conv2d_activation.ops_quant import conv2d_activation_quant  # noqa: F401,E402
from .families.scaled_mm.ops import quantize_per_token, scaled_mm, scaled_mm_quant  # noqa: F401,E402
from .families.scaled_mm.act_quant import scaled_mm_act_quant  # noqa: F401,E402
from .families.scaled_mm.residual import scaled_mm_residual  # noqa: F401,E402
from .families.scaled_mm.calibrate import RangeCheck, calibrate, check_calibration  # noqa: F401,E402
from .families.layer_norm_quant.ops import layer_norm_quant  # noqa: F401,E402
from .families.scaled_mm_fp8.ops import quantize_fp8, scaled_mm_fp8, scaled_mm_fp8_quant  # noqa: F401,E402
from .families.scaled_mm_fp8.act_quant import scaled_mm_fp8_act_quant  # noqa: F401,E402
from .families.scaled_mm_fp8.residual import scaled_mm_fp8_residual  # noqa: F401,E402
from .inductor.fuse_quant import fusable_filter  # noqa: F401,E402
from .quantize import (Fp8QuantLinear, Fp8W8A8Config, Int8W8A8Config, QuantConv2d,  # noqa: F401,E402
                       QuantLinear, quantization_report, quantize_)
from .sensitivity import (ErrorBudgetFilter, Sensitivity, error_budget_filter,  # noqa: F401,E402
                          quantization_sensitivity)
from .tuning import TuningConfig, UncoveredPointsError, prewarm, reload_tuning, tuning_report  # noqa: F401,E402
from .tune.autotune import autotune  # noqa: F401,E402
from .families.hot_path import disable as disable_cpp_hot_path, enable as enable_cpp_hot_path  # noqa: F401,E402


def gemm(a, w, bias=None, activation: str | None = None, config: str = "auto"):
    """`a @ w.T + bias` then `activation`, on the kernel `config` names (`auto`: the tuning DB decides)."""
    import torch

    return torch.ops.oasr.gemm.default(a, w, bias, activation or "none", config)


# OASR_CAPTURE_GEMM=FILE records the shapes of eager oasr.gemm calls (oasr_ops.inductor.capture); unset, this
# is one environment lookup at import and nothing per call.
if _os.environ.get("OASR_CAPTURE_GEMM", "").strip():
    from .inductor import capture as _capture

    _capture.install_from_env()
if _os.environ.get("OASR_CPP_HOT_PATH", "").strip():
    from .families import hot_path as _hot_path

    _hot_path.enable_from_env()
del _os
