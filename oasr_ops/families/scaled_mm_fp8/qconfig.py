"""`Fp8W8A8Config`: what `quantize_(model, Fp8W8A8Config())` / ``"fp8_w8a8"`` and the backend's
``options={"quantization": "fp8_w8a8"}`` accept (the int8 family's `qconfig` holds the scheme table)."""
from __future__ import annotations

from dataclasses import dataclass

from ..scaled_mm.qconfig import check_kernel_field, register_scheme


@dataclass(frozen=True)
class Fp8W8A8Config:
    """fp8 e4m3 weights x e4m3 activations -> `torch.ops.oasr.scaled_mm_fp8`, output in the layer's half dtype.

    Weights: symmetric per output channel, quantized once. Activations: symmetric per token, dynamic. A linear
    layer qualifies when K % 16 == 0 and N % 16 == 0; the others stay full precision.

    Fields:
      kernel: the scaled_mm_fp8 config every quantized layer calls: ``"auto"`` (the tuning DB's scaled_mm_fp8
        entry, else the half-wave heuristic), ``"heuristic"``, ``"torch"`` (torch._scaled_mm), ``"default"`` or
        one config id of the fp8 lane.

      layers: which linears the backend's in-graph quantization converts: ``"fusable"`` (default: only those
        whose input quantization Inductor fuses into a LayerNorm or the fusion pass moves into fc1's epilogue) or
        ``"all"``: `Int8W8A8Config.layers`, the same rule and the same reason.
    """

    kernel: str = "auto"
    layers: str = "fusable"

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel:
            raise ValueError(f"Fp8W8A8Config.kernel must be a config id string, got {self.kernel!r}")
        from .ops import check_config_arg  # (ops imports torch and the kernels: not at this module's import)

        check_kernel_field("Fp8W8A8Config", self.kernel, check_config_arg)
        if self.layers not in ("all", "fusable"):
            raise ValueError(f"Fp8W8A8Config.layers must be 'all' or 'fusable', got {self.layers!r}")


register_scheme("fp8_w8a8", Fp8W8A8Config)
