"""The self-attention `F.multi_head_attention_forward` computes, written as its parts: the packed in-projection
(one Linear to 3E), `scaled_dot_product_attention`, the out-projection. `nn.MultiheadAttention` multiplies its
projection parameters itself (Dynamo keeps its call as one graph node), so neither `quantize_` nor the in-graph
quantization pass found a Linear there (docs/perf/e2e.md, session 26: a stock encoder quantized only its FFNs).
Two users of these functions: `quantize_` converts the module to `LinearMultiheadAttention` (`quantize_attention`),
whose projections are Linear children it then swaps, and keeps quantized stock encoder layers off PyTorch's fused
fast paths (`refuse_fast_paths`); the in-graph pass spells the call out (`inductor/decompose_attention.py`).

The functions run on tensors and on `torch.fx.Proxy` alike (the graph pass calls them with proxies): every branch
is on Python values — the masks' dtype and rank come in as `like` tensors (the traced example values)."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.plans import WarnOnce
from .scaled_mm.quantize import CalibratedInput


def additive_mask(attn_mask: Any, key_padding_mask: Any, num_heads: int, dtype: torch.dtype, *,
                  attn_mask_like: torch.Tensor | None = None, key_padding_mask_like: torch.Tensor | None = None
                  ) -> Any:
    """The float mask `F.multi_head_attention_forward` hands `scaled_dot_product_attention`, broadcastable to
    [B, H, L, S], or None. Its rules: a bool mask is True where attention is *not* allowed (-inf, else 0); an
    `attn_mask` is [L, S] or [B*H, L, S]; a `key_padding_mask` is [B, S]; both given: their sum. `*_like`: the
    masks' example values where the masks are proxies (their dtype and rank decide the branches)."""
    am_like = attn_mask if attn_mask_like is None else attn_mask_like
    kpm_like = key_padding_mask if key_padding_mask_like is None else key_padding_mask_like

    def as_float(mask: Any, like: torch.Tensor) -> Any:
        if like.dtype == torch.bool:
            return torch.zeros_like(mask, dtype=dtype).masked_fill(mask, float("-inf"))
        return mask

    mask = None
    if attn_mask is not None:
        mask = as_float(attn_mask, am_like)
        # [L, S]: every batch and head; [B*H, L, S]: per batch and head
        mask = mask[None, None] if am_like.dim() == 2 else mask.unflatten(0, (-1, num_heads))
    if key_padding_mask is not None:
        kpm = as_float(key_padding_mask, kpm_like)[:, None, None, :]  # [B, 1, 1, S]
        mask = kpm if mask is None else mask + kpm
    return mask


def self_attention(x: Any, in_proj: Callable[[Any], Any], out_proj: Callable[[Any], Any], num_heads: int,
                   mask: Any = None, batch_first: bool = False, dropout_p: float = 0.0) -> Any:
    """Multi-head self-attention of `x` ([L, B, E], or [B, L, E] with `batch_first`), the output in x's layout.
    `in_proj`: x -> [..., 3E] (q, k, v in that order, heads contiguous: `nn.MultiheadAttention.in_proj_weight`'s
    layout); `out_proj`: [..., E] -> [..., E]; `mask`: `additive_mask`'s. The same arithmetic as
    `F.multi_head_attention_forward` with need_weights=False."""
    qkv = in_proj(x).unflatten(-1, (3, num_heads, -1))                          # [., ., 3, H, hd]
    qkv = qkv.permute(2, 0, 3, 1, 4) if batch_first else qkv.permute(2, 1, 3, 0, 4)  # [3, B, H, L, hd]
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask, dropout_p=dropout_p)
    return out_proj(_merge_heads(o, batch_first))


def _split_heads(t: torch.Tensor, num_heads: int, batch_first: bool) -> torch.Tensor:
    """[L, B, E] / [B, L, E] -> [B, H, L, hd]."""
    t = t.unflatten(-1, (num_heads, -1))
    return t.transpose(1, 2) if batch_first else t.permute(1, 2, 0, 3)


def _merge_heads(o: Any, batch_first: bool) -> Any:
    """[B, H, L, hd] -> [B, L, E] / [L, B, E]."""
    return (o.transpose(1, 2) if batch_first else o.permute(2, 0, 1, 3)).flatten(-2)


_WARN = WarnOnce()


class LinearMultiheadAttention(nn.Module):
    """`nn.MultiheadAttention` with its projections as Linear children — `in_proj` ([3E, E]: q, k, v) and
    `out_proj` — so `quantize_` swaps them like any Linear (the stock module multiplies its `in_proj_weight`
    parameter inside `F.multi_head_attention_forward`: no Linear to swap). `from_module` shares the stock module's
    parameters. The stock forward's arguments and results: masks, batch_first, unbatched input, need_weights
    (averaged or per head), dropout in training. Self-attention without weights is one in-projection GEMM, SDPA
    and the out-projection; a cross-attention call projects each input by its rows of `in_proj` (a quantized one
    by its `rows`: per-channel weights slice exactly).

    `_qkv_same_embed_dim = False`: `nn.TransformerEncoderLayer` reads it before taking PyTorch's fused fast path,
    which would multiply `in_proj_weight` itself; False keeps the layer on its Python path, through this module."""

    _qkv_same_embed_dim = False

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, device: Any = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, device=device, dtype=dtype)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, mha: nn.MultiheadAttention) -> "LinearMultiheadAttention":
        """The same attention as `mha` (`convertible`), sharing its parameters."""
        w = mha.in_proj_weight
        m = cls(mha.embed_dim, mha.num_heads, mha.dropout, mha.in_proj_bias is not None, mha.batch_first,
                device="meta", dtype=w.dtype)
        m.in_proj.weight, m.out_proj.weight = w, mha.out_proj.weight
        if mha.in_proj_bias is not None:
            m.in_proj.bias = mha.in_proj_bias
        m.out_proj.bias = mha.out_proj.bias
        return m.train(mha.training)

    @property
    def in_proj_bias(self) -> torch.Tensor | None:  # read by nn.TransformerEncoderLayer's fast-path check
        return getattr(self.in_proj, "bias", None)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if is_causal and attn_mask is None:  # what the stock module says; with its mask, the mask is used
            raise RuntimeError("Need attn_mask if specifying the is_causal hint")
        batched = query.dim() == 3
        if not batched:  # [L, E]: one sequence
            query, key, value = (t.unsqueeze(1) for t in (query, key, value)) if not (query is key is value) \
                else (query.unsqueeze(1),) * 3
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        bf = self.batch_first and batched
        mask = additive_mask(attn_mask, key_padding_mask, self.num_heads, query.dtype)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if query is key is value and not need_weights:
            out = self_attention(query, self.in_proj, self.out_proj, self.num_heads, mask, bf, dropout_p)
        else:
            q, k, v = (_split_heads(t, self.num_heads, bf) for t in self._project(query, key, value))
            if need_weights:  # F.multi_head_attention_forward's explicit path: the weights are returned
                scores = (q * self.head_dim ** -0.5) @ k.transpose(-2, -1)
                attn = torch.softmax(scores if mask is None else scores + mask, dim=-1)
                attn = F.dropout(attn, dropout_p) if dropout_p > 0 else attn
                o, weights = attn @ v, attn.mean(1) if average_attn_weights else attn
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            out = self.out_proj(_merge_heads(o, bf))
        if not batched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A stock `nn.MultiheadAttention`'s state dict loads too (``in_proj_weight`` / ``in_proj_bias`` and the
        16-bit ``out_proj.weight``: a checkpoint saved before `quantize_` converted the module); a 16-bit weight
        arriving at a quantized projection is quantized the way `quantize_` would (its config kept)."""
        for old, new in (("in_proj_weight", "in_proj.weight"), ("in_proj_bias", "in_proj.bias")):
            if prefix + old in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        for name in ("in_proj", "out_proj"):
            child, key = getattr(self, name), f"{prefix}{name}."
            if key + "weight" not in state_dict or not hasattr(child, "weight_q"):
                continue
            w, b = state_dict.pop(key + "weight"), state_dict.pop(key + "bias", None)
            plain = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta", dtype=w.dtype)
            plain.weight = nn.Parameter(w, requires_grad=False)
            if b is not None:
                plain.bias = nn.Parameter(b, requires_grad=False)
            fresh = type(child).from_linear(plain, child.config)
            state_dict.update({key + k: v for k, v in fresh.state_dict().items()})
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v: each input through its rows of `in_proj` (the packed GEMM once for self-attention; k and v in one
        GEMM when key is value)."""
        if query is key is value:
            return tuple(self.in_proj(query).chunk(3, dim=-1))
        e = self.embed_dim
        q = self._rows(0, e)(query)
        if key is value:
            return (q, *self._rows(e, 3 * e)(key).chunk(2, dim=-1))
        return q, self._rows(e, 2 * e)(key), self._rows(2 * e, 3 * e)(value)

    def _rows(self, start: int, stop: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """`in_proj` restricted to output channels [start, stop): a 16-bit Linear by its weight's rows, a quantized
        one by its `rows` (per-channel scales slice exactly); any other module computes all of it, then slices
        (correct, more GEMM work, one warning)."""
        proj = self.in_proj
        if type(proj) is nn.Linear:
            b = proj.bias
            return lambda t: F.linear(t, proj.weight[start:stop], None if b is None else b[start:stop])
        if getattr(proj, "linear_fn", None) is not None:
            return proj.rows(start, stop)
        _WARN(type(proj), f"LinearMultiheadAttention: a cross-attention call through an in_proj of type "
              f"{type(proj).__name__} computes all of it for each input and keeps the rows it needs")
        return lambda t: proj(t)[..., start:stop]


def convertible(module: nn.Module) -> bool:
    """An `nn.MultiheadAttention` whose call `LinearMultiheadAttention` reproduces: a packed in-projection
    (kdim = vdim = embed_dim), no bias_k / bias_v, no add_zero_attn."""
    return (isinstance(module, nn.MultiheadAttention) and module._qkv_same_embed_dim
            and module.in_proj_weight is not None and module.bias_k is None and module.bias_v is None
            and not module.add_zero_attn)


def attention_conversions(model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None
                          ) -> list[tuple[nn.Module, str, nn.Module, "LinearMultiheadAttention"]]:
    """(parent, attribute, stock module, its `LinearMultiheadAttention`) for every `convertible` child module of
    `model` whose projections `filter_fn` wants — asked as ``filter_fn(linear, fqn + ".in_proj" | ".out_proj")``,
    the Linears a scheme's swap then asks again; nothing is replaced yet (a filter that raises changes nothing)."""
    out = []
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if convertible(child):
                conv = LinearMultiheadAttention.from_module(child)
                if _wanted(conv, f"{parent_name}.{name}" if parent_name else name, filter_fn):
                    out.append((parent, name, child, conv))
    return out


def _wanted(conv: LinearMultiheadAttention, fqn: str, filter_fn: Callable[[nn.Module, str], bool] | None) -> bool:
    pre = f"{fqn}." if fqn else ""
    return filter_fn is None or any(bool(filter_fn(lin, pre + name))
                                    for name, lin in (("in_proj", conv.in_proj), ("out_proj", conv.out_proj)))


def quantize_attention(model: Any, swap: Callable[[Any], Any],
                       filter_fn: Callable[[nn.Module, str], bool] | None = None) -> Any:
    """`swap(model)` (a scheme's layer swap, what `quantize_` runs) with the stock attention handled around it:
    each `attention_conversions` module (`model` itself too) becomes a `LinearMultiheadAttention` first, so the
    swap sees its projections; one whose projections the swap left 16-bit (none qualified) goes back to the stock
    module, fast path and all; then `refuse_fast_paths`. Returns what `swap` returns."""
    if not isinstance(model, nn.Module):
        return swap(model)  # (the swap names the wrong type)
    stock_root = model if convertible(model) else None
    if stock_root is not None:
        conv = LinearMultiheadAttention.from_module(stock_root)
        model = conv if _wanted(conv, "", filter_fn) else stock_root
    done = attention_conversions(model, filter_fn)
    for parent, name, _stock, conv in done:
        setattr(parent, name, conv)
    model = swap(model)
    for parent, name, stock, conv in done:
        if not _quantized(conv):
            setattr(parent, name, stock)
    if stock_root is not None and isinstance(model, LinearMultiheadAttention) and not _quantized(model):
        model = stock_root
    refuse_fast_paths(model)
    return model


def _quantized(conv: LinearMultiheadAttention) -> bool:
    return not (type(conv.in_proj) is nn.Linear and type(conv.out_proj) is nn.Linear)


def refuse_fast_paths(model: nn.Module) -> None:
    """Keep every `nn.TransformerEncoderLayer` / `nn.TransformerEncoder` holding a quantized layer (a surviving
    `LinearMultiheadAttention` always holds one) off PyTorch's fused fast paths: those multiply the layers'
    ``.weight`` tensors themselves — a quantized layer's dequantized 16-bit copy, so the model ran unquantized — or
    read ``self_attn.in_proj_weight``. The layer's flag below is read only by its fast-path check."""
    def ours(m: nn.Module) -> bool:
        return any(isinstance(s, CalibratedInput) for s in m.modules())

    for m in model.modules():
        if isinstance(m, nn.TransformerEncoderLayer) and ours(m):
            m.activation_relu_or_gelu = 0
        elif isinstance(m, nn.TransformerEncoder) and ours(m):
            m.use_nested_tensor = False


def fast_path_layers(model: nn.Module) -> list[str]:
    """The `nn.TransformerEncoderLayer`s of `model` that meet the module-level conditions of PyTorch's fused
    inference fast path (`TransformerEncoderLayer.forward`'s own list: eval, fast path enabled, a stock batch-first
    packed attention with bias and an even head count, ReLU/GELU, equal LayerNorm eps, no hooks). Called in eval
    under no_grad with a batched input and no autocast, each runs as one native op whose GEMMs no backend pass
    sees; a census of the model traces them as Linears all the same (`oasr tune census` says so)."""
    if not torch.backends.mha.get_fastpath_enabled():
        return []
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.TransformerEncoderLayer) or m.training:
            continue
        attn = m.self_attn
        if type(attn) is not nn.MultiheadAttention or not attn.batch_first or attn.in_proj_bias is None \
                or not attn._qkv_same_embed_dim or attn.num_heads % 2 == 1:
            continue
        if not m.activation_relu_or_gelu or m.norm1.eps != m.norm2.eps:
            continue
        if any(len(s._forward_hooks) + len(s._forward_pre_hooks) for s in m.modules()):
            continue
        out.append(name)
    return out
