"""oasr_ops: per-shape, per-architecture CUTLASS GEMM selection from measured data, served as torch ops."""
from __future__ import annotations

__version__ = "0.1.0"

from . import library  # noqa: F401  (registers torch.ops.oasr.*)
from .configs import SENTINELS, Config, parse  # noqa: F401
# int8 W8A8: registers torch.ops.oasr.scaled_mm / scaled_mm_quant / quantize_per_token. Note: the attribute
# `oasr_ops.scaled_mm` is the function; the module is sys.modules["oasr_ops.scaled_mm"].
from .scaled_mm import scaled_mm, scaled_mm_quant, quantize_per_token  # noqa: E402,F401
from .quantize import QuantLinear, quantize_, quantization_report  # noqa: E402,F401


def gemm(a, w, bias=None, activation: str | None = None, config: str = "auto"):
    """`a @ w.T + bias` then `activation`, on the kernel `config` names (`auto`: the tuning DB decides)."""
    import torch

    return torch.ops.oasr.gemm.default(a, w, bias, activation or "none", config)


from .tuning import TuningConfig, UncoveredPointsError, prewarm, reload_tuning, tuning_report  # noqa: E402,F401

# OASR_CAPTURE_GEMM=FILE records the shapes of eager oasr.gemm calls (oasr_ops.inductor.capture); unset, this
# is one environment lookup at import and nothing per call.
import os as _os  # noqa: E402

if _os.environ.get("OASR_CAPTURE_GEMM", "").strip():
    from .inductor import capture as _capture

    _capture.install_from_env()
del _os
