"""The layer_norm_quant kernels: (config, variant) -> a complete `.cu` source from templates/layer_norm_quant.cu.j2,
and the JIT spec that builds it through the shared cache (`JitSpec`: same key, trust and build rules).

No CUTLASS and no `Lane`: the kernel is a row reduction, its config space is the row mapping only —
``lnq_r{threads_per_row}_v{vec}`` (threads cooperating on one row, elements per vector load); a CTA holds
``max(1, 128 // threads_per_row)`` rows and each thread keeps up to `CHUNKS` vectors of its row in registers.
Variant (the spec's "dtype"): ``<fp16|bf16>_<scheme>``, the input element type and the quantization scheme (int8,
or fp8: e4m3 outputs with the scale amax / 448, the template's `quantize`).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .jit import JitSpec
from .templates import ABI_VERSION
from .templates import environment as _env

# Version of the `oasr_lnq_*` launcher, checked by the loader (families/layer_norm_quant/kernels.py).
LNQ_ABI_VERSION = 1
CHUNKS = 4  # register-resident vectors per thread: rows up to threads_per_row * vec * CHUNKS elements
THREADS_PER_ROW = (32, 64, 128, 256)
VECS = (4, 8)
CTA_MIN = 128
_ELEMENT = {"fp16": "__half", "bf16": "__nv_bfloat16"}
# scheme -> largest quantized magnitude (symmetric): the scale is amax / qmax (fp8: e4m3's largest finite value).
SCHEMES = {"int8": 127, "fp8": 448}
_ID = re.compile(r"lnq_r([1-9][0-9]*)_v([1-9][0-9]*)")


@dataclass(frozen=True)
class LnqConfig:
    threads_per_row: int
    vec: int

    def __post_init__(self) -> None:
        if self.threads_per_row not in THREADS_PER_ROW or self.vec not in VECS:
            raise ValueError(f"layer_norm_quant config r{self.threads_per_row}_v{self.vec}: threads per row must "
                             f"be one of {THREADS_PER_ROW} and vec one of {VECS}")

    @property
    def id(self) -> str:
        return f"lnq_r{self.threads_per_row}_v{self.vec}"

    @property
    def rows_per_cta(self) -> int:
        return max(1, CTA_MIN // self.threads_per_row)

    @property
    def max_width(self) -> int:
        return self.threads_per_row * self.vec * CHUNKS


def parse_lnq(config_id: str) -> LnqConfig:
    """The config of an ``lnq_r{T}_v{V}`` id; ValueError for anything else."""
    m = _ID.fullmatch(str(config_id))
    if not m:
        raise ValueError(f"not a layer_norm_quant config id: {config_id!r} (lnq_r<threads per row>_v<vec>)")
    return LnqConfig(int(m.group(1)), int(m.group(2)))


SPACE = tuple(LnqConfig(t, v) for t in THREADS_PER_ROW for v in VECS)


def lnq_variant(dtype: str, scheme: str) -> str:
    if dtype not in _ELEMENT:
        raise ValueError(f"layer_norm_quant input dtype must be one of {tuple(_ELEMENT)}, got {dtype!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"layer_norm_quant scheme must be one of {tuple(SCHEMES)}, got {scheme!r}")
    return f"{dtype}_{scheme}"


def render_layer_norm_quant(config: LnqConfig, variant: str) -> str:
    dtype, _, scheme = variant.partition("_")
    lnq_variant(dtype, scheme)
    return _env().get_template("layer_norm_quant.cu.j2").render(
        config_id=config.id, variant=variant, scheme=scheme, element=_ELEMENT[dtype], qmax=SCHEMES[scheme],
        threads_per_row=config.threads_per_row, rows_per_cta=config.rows_per_cta,
        cta_threads=config.threads_per_row * config.rows_per_cta, vec=config.vec, chunks=CHUNKS,
        abi_version=ABI_VERSION, lnq_abi_version=LNQ_ABI_VERSION)


@dataclass(frozen=True)
class LnqSpec(JitSpec):
    """A `JitSpec` whose source is a layer_norm_quant kernel (`lane` is None; `config` an `LnqConfig`)."""

    @staticmethod
    def make(config: LnqConfig, variant: str, cuda_arch: str) -> "LnqSpec":
        return LnqSpec(None, config, variant, cuda_arch)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return f"layer_norm_quant_{self.config.id}_{self.dtype}_sm{self.cuda_arch}"

    @functools.cached_property
    def source(self) -> str:
        return render_layer_norm_quant(self.config, self.dtype)  # type: ignore[arg-type]

    @property
    def est_memory(self) -> float:
        return 0.8e9
