"""Reference workload: a Whisper-style audio encoder (Radford et al., 2022) with random weights.

Architecture, following openai/whisper's ``AudioEncoder``::

    mel (B, 80, 3000) -> Conv1d(80, d, k=3, s=1, p=1) -> GELU -> Conv1d(d, d, k=3, s=2, p=1) -> GELU
        -> transpose to (B, 1500, d) -> + sinusoidal positions
        -> N x [ x = x + MHA(LN(x));  x = x + Linear(4d, d)(GELU(Linear(d, 4d)(LN(x)))) ]   # pre-LN
        -> LayerNorm -> (B, 1500, d)

* **Input layout is channels-first, (B, 80, 3000)**, exactly what Whisper's log-mel frontend produces
  (``census_info["input_layout"] == "BFT"``). Other shapes are rejected: Whisper always pads/trims audio to
  a fixed 30 s window (:data:`FIXED_WINDOW_FRAMES` = 3000 frames at 10 ms), so every GEMM has
  M = B * 1500 regardless of the utterance's real length. That is why a census must key this model at
  exactly 3000 frames, not at the utterance's duration.
* Attention uses separate q/k/v ``nn.Linear(d, d)`` (k without bias, as in Whisper) and ``Linear(d, d)``
  output, with ``F.scaled_dot_product_attention`` (its default 1/sqrt(hd) scale equals Whisper's split
  hd^-0.25 on q and k). There is no dropout: Whisper's encoder has none.

Sizes (``d_model`` / heads / layers; MLP hidden 4d), matching Whisper tiny/base/small:

=====  =======  =====  ======  ==========
size   d_model  heads  layers  parameters
=====  =======  =====  ======  ==========
tiny   384      6      4       7.63 M
base   512      8      6       19.82 M
small  768      12     12      87.00 M
=====  =======  =====  ======  ==========

Per block (M = B*1500 rows) the Linear GEMMs are (N, K): q, k, v, out (d, d) each; MLP (4d, d), (d, 4d).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._common import apply_overrides, parse_device, parse_dtype, parse_int, random_features, seeded_build, sinusoids

FIXED_WINDOW_FRAMES = 3000  # 30 s of 10 ms frames; every input is padded/trimmed to this by Whisper
N_MELS = 80

# For a workload census: 10 ms frames, one stride-2 conv (2x), and a fixed window, so the GEMM M per
# utterance is always output_frames(FIXED_WINDOW_FRAMES) = 1500 whatever the audio duration.
census_info: dict[str, Any] = {
    "frame_shift_ms": 10,
    "subsampling": 2,
    "fixed_window": FIXED_WINDOW_FRAMES,
    "n_mels": N_MELS,
    "input_layout": "BFT",  # (batch, mel bins, frames)
}


@dataclass(frozen=True)
class WhisperEncoderConfig:
    """Architecture knobs; any field can be overridden through ``build_model(**kw)`` (strings accepted).

    The window (3000 frames -> 1500 positions) is deliberately not a field: it is what makes this workload
    Whisper-like.
    """

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 6
    mlp_mult: int = 4
    n_mels: int = N_MELS
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if self.d_model % 2:
            raise ValueError("d_model must be even for sinusoidal positions")


SIZES: dict[str, WhisperEncoderConfig] = {
    "tiny": WhisperEncoderConfig(d_model=384, num_heads=6, num_layers=4),
    "base": WhisperEncoderConfig(d_model=512, num_heads=8, num_layers=6),
    "small": WhisperEncoderConfig(d_model=768, num_heads=12, num_layers=12),
}


def output_frames(frames: int = FIXED_WINDOW_FRAMES) -> int:
    """Encoder positions for the input window: conv2 is k=3, s=2, p=1, i.e. ceil(frames / 2) = 1500."""
    return (int(frames) + 1) // 2


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: WhisperEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.num_heads = cfg.num_heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d, bias=False)  # Whisper's key has no bias (it would cancel in softmax)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.num_heads
        q, k, v = (lin(x).view(b, t, h, d // h).transpose(1, 2) for lin in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class ResidualAttentionBlock(nn.Module):
    def __init__(self, cfg: WhisperEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.attn_ln = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(cfg)
        self.mlp_ln = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_mult * d), nn.GELU(), nn.Linear(cfg.mlp_mult * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class WhisperEncoder(nn.Module):
    """(B, 80, 3000) log-mels -> (B, 1500, d)."""

    def __init__(self, cfg: WhisperEncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.d_model = cfg.d_model
        self.num_layers = cfg.num_layers
        self.n_ctx = output_frames(FIXED_WINDOW_FRAMES)
        self.conv1 = nn.Conv1d(cfg.n_mels, cfg.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, kernel_size=3, stride=2, padding=1)
        # A fixed table, as in Whisper; non-persistent so state_dict() holds only learnable weights.
        self.register_buffer("positional_embedding", sinusoids(self.n_ctx, cfg.d_model), persistent=False)
        self.blocks = nn.ModuleList(ResidualAttentionBlock(cfg) for _ in range(cfg.num_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        expected = (self.config.n_mels, FIXED_WINDOW_FRAMES)
        if mel.dim() != 3 or tuple(mel.shape[1:]) != expected:
            raise ValueError(f"Whisper encoder expects (B, {expected[0]}, {expected[1]}) log-mels "
                             f"(channels-first, padded to the fixed window), got {tuple(mel.shape)}")
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, 1500, d)
        x = x + self.positional_embedding.to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


def config_for(size: str = "base", **kw: Any) -> WhisperEncoderConfig:
    key = str(size).strip().lower()
    if key not in SIZES:
        raise ValueError(f"unknown whisper size {size!r}; expected one of {sorted(SIZES)}")
    return apply_overrides(SIZES[key], kw)


def build_model(size: str = "base", dtype: torch.dtype | str = torch.float16, device: torch.device | str = "cpu",
                seed: int | str = 0, **kw: Any) -> WhisperEncoder:
    """A randomly initialised Whisper-style encoder in eval mode.

    ``kw`` overrides :class:`WhisperEncoderConfig` fields (e.g. ``num_layers=2`` for fast tests); strings are
    accepted everywhere. Same seed, same weights on every device; ``device="meta"`` builds without memory.
    """
    cfg = config_for(size, **kw)
    return seeded_build(lambda: WhisperEncoder(cfg), parse_int(seed, "seed"), parse_dtype(dtype),
                        parse_device(device))


def example_inputs(batch: int | str = 1, dtype: torch.dtype | str = torch.float16,
                   device: torch.device | str = "cpu", seed: int | str = 0) -> tuple[torch.Tensor]:
    """``(mel,)`` of shape (batch, 80, 3000): the fixed window, channels-first."""
    mel = random_features((parse_int(batch, "batch"), N_MELS, FIXED_WINDOW_FRAMES), parse_int(seed, "seed"),
                          parse_dtype(dtype), parse_device(device))
    return (mel,)


def describe(size: str = "base", **kw: Any) -> dict[str, Any]:
    return {"model": "whisper", "size": str(size).lower(), **asdict(config_for(size, **kw)), **census_info}
