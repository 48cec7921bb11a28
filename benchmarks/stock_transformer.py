"""A Whisper-small-sized encoder stack built from stock `nn.TransformerEncoderLayer`s (pre-norm, GELU, 768 x 12,
12 heads, FFN 3072) over precomputed frame features: the model a user gets from `nn.TransformerEncoder`, for
`benchmarks/e2e_compare.py --model benchmarks.stock_transformer:build_model --inputs
benchmarks.stock_transformer:example_inputs`. In eval under no_grad each layer runs PyTorch's fused fast path
(`torch._transformer_encoder_layer_fwd`) unless `torch.backends.mha.set_fastpath_enabled(False)`; a `quantize_`d
copy leaves it by itself (`benchmarks/e2e_int8_fused.py --model benchmarks.stock_transformer:build_model`, device
step `e2e-stock-transformer-int8-q`)."""
from __future__ import annotations

import torch
from torch import nn


def build_model(d: int = 768, layers: int = 12, heads: int = 12, ffn: int = 3072, dtype: torch.dtype = torch.float16,
                device: str = "cpu", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True)
    # enable_nested_tensor=False: no padding mask here, and the nested path would only add a warning
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return model.to(device=device, dtype=dtype).eval()


def example_inputs(batch: int = 8, frames: int = 1500, d: int = 768, dtype: torch.dtype = torch.float16,
                   device: str = "cpu", seed: int = 1) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, frames, d, generator=g).to(device=device, dtype=dtype),)
