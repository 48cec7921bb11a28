"""Kernel families, one folder each; importing this package registers every one of them (one line each).

A family folder declares, in its ``__init__``, a `oasr_ops.runtime.registry.FamilySpec`: its DB ops and signature
rules, its lanes, its untuned policy, and the hooks the generic layers call. `docs/architecture.md` has the recipe
for adding one.
"""
from __future__ import annotations

from . import gemm  # noqa: F401  (fp16/bf16 Linear GEMM: torch.ops.oasr.gemm)
from . import scaled_mm  # noqa: F401  (int8 W8A8: torch.ops.oasr.scaled_mm / scaled_mm_quant)
from . import bmm  # noqa: F401  (batched GEMM of attention: torch.ops.oasr.bmm)
from . import conv1d  # noqa: F401  (depthwise conv1d of the Conformer conv module: torch.ops.oasr.conv1d_depthwise)
from . import conv2d_activation  # noqa: F401  (NHWC conv2d + activation of the frontend: torch.ops.oasr.conv2d_activation)
from . import scaled_mm_fp8  # noqa: F401  (fp8 e4m3 W8A8: torch.ops.oasr.scaled_mm_fp8 / scaled_mm_fp8_quant)
from . import layer_norm_quant  # noqa: F401  (fused LayerNorm -> per-token quantization)
