"""Quantization configs: what `oasr_ops.quantize_(model, config)` and the backend's
``options={"quantization": config}`` accept (torchao's convention: a config object says what to do, a handler
registered for its type does it; `oasr_ops.quantize.register_quantize_handler`).

Each config is a frozen dataclass (hashable, comparable, safe to share between compiles). The strings of the
older API name a config with its defaults (`SCHEMES`); `as_quant_config` turns either form into the object.
Lives in the scaled_mm family (layer 3) so the graph pass (layer 5) and the public API (layer 6) share it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Int8W8A8Config:
    """int8 weights x int8 activations -> `torch.ops.oasr.scaled_mm`, output in the layer's half dtype.

    Weights: symmetric per output channel, quantized once. Activations: symmetric per token, quantized at every
    call (dynamic). A linear layer qualifies when K % 16 == 0 and N % 8 == 0; the others stay full precision.

    Fields:
      kernel: the scaled_mm config every quantized layer calls: ``"auto"`` (default: the tuning DB's scaled_mm
        entry for the layer's signature, else the int8 shape heuristic), ``"heuristic"``, ``"default"``, or one
        config id of the int8 lane (pins a tile, e.g. for a benchmark).

      layers: which linears the backend's in-graph quantization (``options={"quantization": ...}``) converts:
        ``"fusable"`` (default: only those whose input quantization the fusion pass moves into the producer —
        after a LayerNorm, or after GELU/SiLU of such a layer when calibrated with `oasr_ops.calibrate`;
        `oasr_ops.families.quant_patterns.fusable_linears`; the rest stay in 16 bits, where int8 does not pay) or
        ``"all"`` (every qualifying one). Measured (docs/perf/e2e.md, session 33, H200, fp16 Inductor = 1, with
        ``fuse_quantization=True``): ``"all"`` 0.96-1.03x on the three example models; ``"fusable"`` 1.08-1.16x,
        calibrated 1.33-1.41x, calibrated and compiled frozen 1.40-1.66x
        (``torch._inductor.config.freezing = True``). One warning when ``"fusable"`` leaves a calibratable fc2 in
        16 bits or quantizes nothing. `quantize_` swaps every qualifying layer whatever this field says
        (torchao's convention: it does what it is asked); its filter for the same choice is
        `oasr_ops.fusable_filter(model, *example_inputs)`, and the census (`oasr tune census --quantization`)
        records every layer so the DB covers either choice.
      convs: whether `quantize_` also swaps the qualifying `nn.Conv2d` layers (groups 1, dilation 1, Cin % 16 == 0,
        Cout % 8 == 0: a speech frontend's second conv) for `QuantConv2d` (int8 filter per output channel, input
        per tensor; `oasr_ops.families.conv2d_activation.quantize`). Default True; `filter_fn` sees them too. The
        in-graph quantization (``options={"quantization": ...}``) converts the same convs (`quantize_pass`).
    """

    kernel: str = "auto"
    layers: str = "fusable"
    convs: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel:
            raise ValueError(f"Int8W8A8Config.kernel must be a config id string, got {self.kernel!r}")
        from .ops import check_config_arg  # (ops imports torch and the kernels: not at this module's import)

        check_kernel_field("Int8W8A8Config", self.kernel, check_config_arg)
        if self.layers not in ("all", "fusable"):
            raise ValueError(f"Int8W8A8Config.layers must be 'all' or 'fusable', got {self.layers!r}")
        if not isinstance(self.convs, bool):
            raise ValueError(f"Int8W8A8Config.convs must be True or False, got {self.convs!r}")


def check_kernel_field(config_type: str, kernel: str, check_config_arg: Callable[[str], None]) -> None:
    """A quantization config's ``kernel``, checked up front by its op's config rule (`check_config_arg`: auto, a
    sentinel, an id of the family's lanes, a region table) rather than at the first call on a GPU."""
    try:
        check_config_arg(kernel)
    except ValueError as e:
        raise ValueError(f"{config_type}.kernel: {e}") from None


# The string names of the older API -> their config type (constructed with its defaults). Other families add
# theirs with `register_scheme` (fp8_w8a8: families/scaled_mm_fp8/qconfig.py).
SCHEMES: dict[str, type] = {"int8_w8a8": Int8W8A8Config}


def register_scheme(name: str, config_type: type) -> None:
    """Make the string `name` mean ``config_type()`` for `quantize_` and ``options={"quantization": name}``."""
    if SCHEMES.get(name, config_type) is not config_type:
        raise ValueError(f"quantization scheme {name!r} is already {SCHEMES[name].__name__}")
    SCHEMES[name] = config_type


def as_quant_config(config: Any) -> Any:
    """A config object for `config`: a known scheme string becomes its config with defaults; an object is
    returned as is (its handler is looked up by the caller). ValueError for an unknown string."""
    if isinstance(config, str):
        cls = SCHEMES.get(config)
        if cls is None:
            raise ValueError(f"unknown scheme {config!r}; supported: {', '.join(SCHEMES)} or a config object "
                             f"such as Int8W8A8Config() / Fp8W8A8Config()")
        return cls()
    return config
