"""Reference workload: a Conformer encoder (Gulati et al., 2020) with random weights.

Architecture (per block, pre-norm, "macaron" layout)::

    x = x + 0.5 * FFN(x)          # LayerNorm -> Linear(d, 4d) -> SiLU -> Dropout -> Linear(4d, d) -> Dropout
    x = x + MHSA(x)               # LayerNorm -> fused qkv Linear(d, 3d) -> SDPA -> Linear(d, d) -> Dropout
    x = x + ConvModule(x)         # LayerNorm -> pointwise Linear(d, 2d) -> GLU -> depthwise Conv1d(k=31)
                                  #   -> BatchNorm1d -> SiLU -> pointwise Linear(d, d) -> Dropout
    x = x + 0.5 * FFN(x)
    x = LayerNorm(x)

Frontend: log-mel features ``(B, T, 80)`` -> Conv2d(1, C, 3, stride 2) -> ReLU -> Conv2d(C, C, 3, stride 2)
-> ReLU -> Linear(C * 19, d), with C = d (the ESPnet ``Conv2dSubsampling`` recipe). That is 4x subsampling:
``T' = ((T - 1) // 2 - 1) // 2`` (see :func:`output_frames`), e.g. 1000 frames (10 s) -> 249.

Simplifications, stated so nobody mistakes this for a paper-exact model:

* **Positions are absolute sinusoids added once after subsampling** by default (``attention="sdpa"``), not
  the relative positional encoding (Transformer-XL style) of the paper. ``attention="rel_pos"`` builds the
  paper's (ESPnet's ``RelPositionMultiHeadedAttention``): per layer a ``Linear(d, d)`` (no bias) on a (2T'-1, d)
  relative sinusoid table, learned biases u and v, ``(q + u) k^T + rel_shift((q + v) p^T)``, softmax, ``@ v`` —
  written with ``torch.matmul`` (three batched GEMMs per layer, the ``bmm`` the backend rewrites), since SDPA
  takes no such score term.
* **The pointwise convolutions are ``nn.Linear``** over the channel axis, not 1x1 ``Conv1d``. They compute the
  same thing, but as ``nn.Linear`` the GEMMs (M = B*T', N in {2d, d}, K = d) are visible to a graph pass that
  rewrites ``aten.addmm``/``aten.linear``; a 1x1 convolution would hide them inside ``aten.convolution``.
  The subsampling convs and the depthwise conv stay convolutions (they are not plain GEMMs).
  ``conv_impl="conv1d"`` writes the module as ESPnet/NeMo/HF do instead, on ``(B, d, T)`` after one transpose:
  ``Conv1d(d, 2d, 1) -> GLU(dim=1) -> depthwise Conv1d(d, d, k, groups=d) -> BatchNorm1d -> SiLU ->
  Conv1d(d, d, 1)`` (the form whose depthwise conv the ``conv1d`` family rewrites in the [B, C, T] layout).
* q/k/v are one fused ``Linear(d, 3d)`` (``fused_qkv=False`` gives three ``Linear(d, d)``, the ESPnet layout).
* Dropout exists (p=0.1, like a training recipe) but the model is returned in eval mode, where it is skipped
  entirely (no ``dropout`` node in a traced or exported graph).

Sizes (``d_model`` / heads / layers; FFN hidden is 4d; depthwise kernel 31; parameters counted exactly by
``tests/test_examples.py``). These are wider than the paper's S/M/L (d = 144/256/512, 16/16/17 layers): the
project chose them so the three sizes cover GEMM widths d = 256, 512 and 1024.

====  =======  =====  ======  ==========
size  d_model  heads  layers  parameters
====  =======  =====  ======  ==========
S     256      4      16      26.21 M
M     512      8      16      104.31 M
L     1024     16     17      440.43 M
====  =======  =====  ======  ==========

Per block and frame (M = B*T' rows), the Linear GEMMs are (N, K): FFN (4d, d), (d, 4d) twice; qkv (3d, d);
attention out (d, d); conv-module pointwise (2d, d) and (d, d). The subsampling Linear is (d, 19*C) once.

Usage::

    model = build_model("M", dtype="fp16", device="cuda")
    (feats,) = example_inputs(batch=8, frames=1000, dtype="fp16", device="cuda")
    out = model(feats)                                 # (8, 249, 512)
    out, out_lens = model(feats, lengths)              # with padding masks, when lengths are given
"""
from __future__ import annotations

import math

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._common import apply_overrides, parse_device, parse_dtype, parse_int, random_features, seeded_build, sinusoids

# What a workload census needs to turn audio durations into GEMM M dimensions: 10 ms frame shift (100 frames
# per second), 4x subsampling, any input length (no fixed window). M per utterance = output_frames(frames).
census_info: dict[str, Any] = {
    "frame_shift_ms": 10,
    "subsampling": 4,
    "fixed_window": None,
    "n_mels": 80,
    "input_layout": "BTF",  # (batch, frames, mel bins)
}


@dataclass(frozen=True)
class ConformerConfig:
    """All architecture knobs; any field can be overridden through ``build_model(**kw)`` (strings accepted)."""

    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 16
    ff_mult: int = 4                    # FFN hidden = ff_mult * d_model
    conv_kernel: int = 31               # depthwise conv kernel; must be odd ("same" padding)
    n_mels: int = 80
    subsampling_channels: int | None = None  # conv2d channels in the frontend; None -> d_model (ESPnet)
    conv_norm: str = "batch"            # "batch" (paper) or "layer" in the convolution module
    fused_qkv: bool = True
    dropout: float = 0.1                # inactive in eval mode; kept so train() behaves like a recipe
    layer_norm_eps: float = 1e-5
    attention: str = "sdpa"             # "sdpa" (absolute positions) or "rel_pos" (relative, explicit matmuls)
    conv_impl: str = "linear"           # conv module's pointwise convs: "linear" (nn.Linear) or "conv1d" (nn.Conv1d)

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if self.conv_kernel % 2 == 0:
            raise ValueError(f"conv_kernel must be odd for same-length output, got {self.conv_kernel}")
        if self.conv_norm not in ("batch", "layer"):
            raise ValueError(f"conv_norm must be 'batch' or 'layer', got {self.conv_norm!r}")
        if self.d_model % 2:
            raise ValueError("d_model must be even for sinusoidal positions")
        if self.attention not in ("sdpa", "rel_pos"):
            raise ValueError(f"attention must be 'sdpa' or 'rel_pos', got {self.attention!r}")
        if self.conv_impl not in ("linear", "conv1d"):
            raise ValueError(f"conv_impl must be 'linear' or 'conv1d', got {self.conv_impl!r}")
        if self.conv_impl == "conv1d" and self.conv_norm != "batch":
            raise ValueError("conv_impl='conv1d' is the BatchNorm recipe (conv_norm='batch')")


SIZES: dict[str, ConformerConfig] = {
    "S": ConformerConfig(d_model=256, num_heads=4, num_layers=16),
    "M": ConformerConfig(d_model=512, num_heads=8, num_layers=16),
    "L": ConformerConfig(d_model=1024, num_heads=16, num_layers=17),
}


def output_frames(frames: int) -> int:
    """Encoder frames for ``frames`` input frames: two unpadded k=3 stride-2 convs."""
    return max(((int(frames) - 1) // 2 - 1) // 2, 0)


def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """Tensor version of :func:`output_frames` (used for padding masks)."""
    return torch.clamp(torch.div(torch.div(lengths - 1, 2, rounding_mode="floor") - 1, 2, rounding_mode="floor"),
                       min=0)


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    # Not an nn.Dropout: in eval this emits no node at all, so traced/exported graphs read
    # linear -> silu -> linear with nothing between a GEMM and its epilogue for a rewriting pass to skip.
    return F.dropout(x, p, training=True) if training and p > 0 else x


class Conv2dSubsampling4(nn.Module):
    """(B, T, F) -> (B, T', d): two 3x3 stride-2 conv2d + ReLU, flatten channels x freq, Linear to d."""

    def __init__(self, n_mels: int, channels: int, d_model: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, kernel_size=3, stride=2), nn.ReLU(),
            nn.Conv2d(channels, channels, kernel_size=3, stride=2), nn.ReLU(),
        )
        freq = ((n_mels - 1) // 2 - 1) // 2  # 80 mel bins -> 19
        self.out = nn.Linear(channels * freq, d_model)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self.conv(feats.unsqueeze(1))             # (B, C, T', F')
        b, c, t, f = x.shape
        # Channel-major flatten (c, f) per frame, as ESPnet does, so the Linear sees one contiguous row per frame.
        return self.out(x.transpose(1, 2).reshape(b, t, c * f))


class FeedForward(nn.Module):
    """Pre-norm FFN: LayerNorm -> Linear(d, 4d) -> SiLU -> Dropout -> Linear(4d, d) -> Dropout."""

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        hidden = cfg.ff_mult * cfg.d_model
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(cfg.d_model, hidden)
        self.fc2 = nn.Linear(hidden, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _dropout(F.silu(self.fc1(self.norm(x))), self.dropout, self.training)
        return _dropout(self.fc2(h), self.dropout, self.training)


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, 2T-1) scores per relative offset (T-1 .. 1-T) -> (B, H, T, T) per key (ESPnet's rel_shift)."""
    b, h, t, n = x.shape
    padded = F.pad(x, (1, 0)).view(b, h, n + 1, t)
    return padded[:, :, 1:].reshape(b, h, t, n)[..., : n // 2 + 1]


def rel_positions(t: int, d: int, device: torch.device | None = None) -> torch.Tensor:
    """(2T-1, d) fp32 sinusoids of the relative offsets T-1, ..., 0, ..., 1-T (ESPnet's RelPositionalEncoding)."""
    half = d // 2
    inv = torch.exp(torch.arange(half, device=device, dtype=torch.float32) * (-math.log(10000.0) / half))
    offs = torch.arange(t - 1, -t, -1, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.stack([torch.sin(offs), torch.cos(offs)], dim=-1).reshape(2 * t - 1, d)


class MultiHeadSelfAttention(nn.Module):
    """Pre-norm MHSA over (B, T, d); ``mask`` is (B, T) bool, True on real (non-padding) frames."""

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.num_heads = cfg.num_heads
        self.head_dim = d // cfg.num_heads
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fused_qkv = cfg.fused_qkv
        if cfg.fused_qkv:
            self.qkv = nn.Linear(d, 3 * d)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.dropout = cfg.dropout
        self.rel_pos = cfg.attention == "rel_pos"
        if self.rel_pos:
            self.linear_pos = nn.Linear(d, d, bias=False)
            self.pos_bias_u = nn.Parameter(torch.randn(self.num_heads, self.head_dim) * 0.02)
            self.pos_bias_v = nn.Parameter(torch.randn(self.num_heads, self.head_dim) * 0.02)

    def _rel_pos_attention(self, q, k, v, pos, mask):
        """ESPnet's relative-position attention; q, k, v (B, H, T, hd), pos (2T-1, d) for offsets T-1 .. 1-T."""
        h, hd = self.num_heads, self.head_dim
        p = self.linear_pos(pos).view(-1, h, hd).transpose(0, 1)              # (H, 2T-1, hd)
        ac = torch.matmul(q + self.pos_bias_u[:, None], k.transpose(-1, -2))  # (B, H, T, T)
        bd = _rel_shift(torch.matmul(q + self.pos_bias_v[:, None], p.transpose(-1, -2)))  # (B, H, T, T)
        scores = (ac + bd) * hd ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        attn = _dropout(torch.softmax(scores.float(), dim=-1).to(q.dtype), self.dropout, self.training)
        return torch.matmul(attn, v)                                            # (B, H, T, hd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        h, hd = self.num_heads, self.head_dim
        y = self.norm(x)
        if self.fused_qkv:
            q, k, v = self.qkv(y).view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd)
        else:
            q, k, v = (lin(y).view(b, t, h, hd).transpose(1, 2) for lin in (self.q, self.k, self.v))
        # Key-padding mask broadcast over heads and queries; padded queries still produce (ignored) rows.
        if self.rel_pos:
            y = self._rel_pos_attention(q, k, v, pos, mask)
        else:
            attn_mask = None if mask is None else mask[:, None, None, :]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               dropout_p=self.dropout if self.training else 0.0)
        return _dropout(self.out(y.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)


class ConvolutionModule(nn.Module):
    """LayerNorm -> Linear(d, 2d) -> GLU -> depthwise Conv1d -> BatchNorm/LayerNorm -> SiLU -> Linear(d, d)."""

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.pointwise1 = nn.Linear(d, 2 * d)  # == Conv1d(d, 2d, 1), kept as a Linear so the GEMM is visible
        self.depthwise = nn.Conv1d(d, d, cfg.conv_kernel, padding=cfg.conv_kernel // 2, groups=d)
        self.batch_norm = cfg.conv_norm == "batch"
        self.conv_norm: nn.Module = nn.BatchNorm1d(d) if self.batch_norm else nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.pointwise2 = nn.Linear(d, d)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = F.glu(self.pointwise1(self.norm(x)), dim=-1)      # (B, T, d)
        if mask is not None:
            # Zero padding frames so the depthwise kernel does not smear them into real frames near the end.
            y = y.masked_fill(~mask[..., None], 0.0)
        y = self.depthwise(y.transpose(1, 2))                 # (B, d, T)
        if self.batch_norm:
            y = self.conv_norm(y).transpose(1, 2)
        else:
            y = self.conv_norm(y.transpose(1, 2))
        return _dropout(self.pointwise2(F.silu(y)), self.dropout, self.training)


class Conv1dConvolutionModule(nn.Module):
    """The ESPnet/NeMo form: LayerNorm -> (B, d, T) -> Conv1d(d, 2d, 1) -> GLU(dim=1) -> depthwise Conv1d ->
    BatchNorm1d -> SiLU -> Conv1d(d, d, 1) -> (B, T, d). Same parameters as `ConvolutionModule` (the pointwise
    weights carry a trailing kernel dim of 1)."""

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.pointwise1 = nn.Conv1d(d, 2 * d, 1)
        self.depthwise = nn.Conv1d(d, d, cfg.conv_kernel, padding=cfg.conv_kernel // 2, groups=d)
        self.conv_norm = nn.BatchNorm1d(d)
        self.pointwise2 = nn.Conv1d(d, d, 1)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = F.glu(self.pointwise1(self.norm(x).transpose(1, 2)), dim=1)  # (B, d, T)
        if mask is not None:
            y = y.masked_fill(~mask[:, None, :], 0.0)  # padding frames must not leak into real ones
        y = F.silu(self.conv_norm(self.depthwise(y)))
        return _dropout(self.pointwise2(y).transpose(1, 2), self.dropout, self.training)


class ConformerBlock(nn.Module):
    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        self.ff1 = FeedForward(cfg)
        self.mhsa = MultiHeadSelfAttention(cfg)
        self.conv = Conv1dConvolutionModule(cfg) if cfg.conv_impl == "conv1d" else ConvolutionModule(cfg)
        self.ff2 = FeedForward(cfg)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)  # macaron: two half-step FFNs sandwich attention and convolution
        x = x + self.mhsa(x, mask, pos)
        x = x + self.conv(x, mask)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class ConformerEncoder(nn.Module):
    """(B, T, n_mels) log-mels [+ (B,) int lengths] -> (B, T', d) [+ (B,) output lengths].

    Without ``lengths`` every frame is treated as real and only the tensor is returned (the shape a graph
    pass or ``torch.export`` sees most simply). With ``lengths`` padding is masked in attention and in the
    depthwise conv, and ``(output, output_lengths)`` is returned; outputs at padded positions are finite
    but meaningless.
    """

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.d_model = cfg.d_model
        self.num_layers = cfg.num_layers
        self.subsample = Conv2dSubsampling4(cfg.n_mels, cfg.subsampling_channels or cfg.d_model, cfg.d_model)
        self.blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.num_layers))

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.subsample(feats)
        t = x.shape[1]
        # Computed per call in fp32 (cheap, no max-length cap) and cast to the activation dtype.
        pos = None
        if self.config.attention == "rel_pos":
            pos = rel_positions(t, self.d_model, device=x.device).to(x.dtype)
        else:
            x = x + sinusoids(t, self.d_model, device=x.device).to(x.dtype)
        mask = out_lens = None
        if lengths is not None:
            out_lens = output_lengths(lengths.to(x.device))
            # clamp(min=1): a fully-masked attention row would be NaN for utterances shorter than 7 frames.
            mask = torch.arange(t, device=x.device)[None, :] < out_lens.clamp(min=1)[:, None]
        for block in self.blocks:
            x = block(x, mask, pos)
        return x if out_lens is None else (x, out_lens)


def config_for(size: str = "S", **kw: Any) -> ConformerConfig:
    """The config of a named size with overrides applied (strings coerced to the field types)."""
    key = str(size).strip().upper()
    if key not in SIZES:
        raise ValueError(f"unknown conformer size {size!r}; expected one of {sorted(SIZES)}")
    return apply_overrides(SIZES[key], kw)


def build_model(size: str = "S", dtype: torch.dtype | str = torch.float16, device: torch.device | str = "cpu",
                seed: int | str = 0, **kw: Any) -> ConformerEncoder:
    """A randomly initialised Conformer encoder in eval mode.

    ``dtype`` defaults to fp16, the dtype the GEMM ops serve; pass ``dtype="fp32"`` for CPU references.
    ``kw`` overrides :class:`ConformerConfig` fields (e.g. ``num_layers=2``); CLI strings are accepted for
    every argument. The same ``seed`` gives bit-identical weights on every device (init runs on the CPU).
    ``device="meta"`` builds without allocating (to count parameters of L cheaply).
    """
    cfg = config_for(size, **kw)
    return seeded_build(lambda: ConformerEncoder(cfg), parse_int(seed, "seed"), parse_dtype(dtype),
                        parse_device(device))


def example_inputs(batch: int | str = 2, frames: int | str = 1000, dtype: torch.dtype | str = torch.float16,
                   device: torch.device | str = "cpu", seed: int | str = 0, with_lengths: bool | str = False
                   ) -> tuple[torch.Tensor, ...]:
    """``(feats,)`` of shape (batch, frames, 80), or ``(feats, lengths)`` with ``with_lengths=True``.

    The lengths run evenly from ``frames`` (the first utterance is unpadded) down to about ``frames // 2``,
    like a length-sorted batch.
    """
    b, t = parse_int(batch, "batch"), parse_int(frames, "frames")
    device = parse_device(device)
    feats = random_features((b, t, census_info["n_mels"]), parse_int(seed, "seed"), parse_dtype(dtype), device)
    if str(with_lengths).lower() not in ("true", "1", "yes", "on"):
        return (feats,)
    lengths = torch.linspace(t, max(t // 2, 1), b).round().to(torch.int64).to(device)
    return feats, lengths


def describe(size: str = "S", **kw: Any) -> dict[str, Any]:
    """Config fields of a size plus ``census_info``, for logging."""
    return {"model": "conformer", "size": str(size).upper(), **asdict(config_for(size, **kw)), **census_info}
