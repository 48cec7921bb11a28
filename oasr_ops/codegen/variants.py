"""The kernel variant names of the quantizing GEMM families and their launchers' ABI versions.

The families (ops, prebuild plans, kernel loaders) need these names on every `import oasr_ops`; the emitters that
render the variants (`emit_int8.py`, `emit_fp8.py`) need cutlass_library. Keeping the names here keeps
cutlass_library out of `import oasr_ops`: it is imported on the first render only, through
`paths.import_cutlass_library` (its generator parses the process's command line at import).
"""
from __future__ import annotations

# Quantizing variants with an activation before the quantization (int8 op `scaled_mm_act_quant`: ``int8_<act>``,
# fp8 op `scaled_mm_fp8_act_quant`: ``fp8_<act>``; one template snippet for both).
ACTIVATIONS = ("gelu", "silu")
# Residual variants (op `scaled_mm_residual`): ``<fp16|bf16>_res``, the residual stream added in the epilogue.
RESIDUAL_SUFFIX = "_res"
RESIDUAL_VARIANTS = tuple(f"{d}{RESIDUAL_SUFFIX}" for d in ("fp16", "bf16"))
# The int8 act-quant variants' bias element by suffix ("": fp32, the op's original contract; a 16-bit model's bias
# is read as it is, which saves the fusion pass a `bias.float()` kernel per call).
ACT_BIAS_SUFFIX = {"fp32": "", "fp16": "_fp16bias", "bf16": "_bf16bias"}
INT8_ACT_VARIANTS = tuple(f"int8_{a}{b}" for a in ACTIVATIONS for b in ACT_BIAS_SUFFIX.values())
FP8_ACT_VARIANTS = tuple(f"fp8_{a}" for a in ACTIVATIONS)

# Version of the scaled_mm C launcher (`oasr_smm_*`), checked by the loader in families/scaled_mm/kernels.py.
SMM_ABI_VERSION = 1
# Version of the residual variants' launcher (`oasr_smmr_*`: the residual pointer and alpha added), same loader.
SMMR_ABI_VERSION = 1


def act_variant(activation: str, bias: str | None) -> str:
    """The kernel variant of one `scaled_mm_act_quant` call: its activation and its bias's element, ``fp32`` /
    ``fp16`` / ``bf16`` (None, no bias: the fp32 variant, whose bias pointer is then null)."""
    return f"int8_{activation}{ACT_BIAS_SUFFIX[bias or 'fp32']}"
