"""`F.multi_head_attention_forward` and the fused encoder-layer fast path spelt out as their parts in Dynamo's graph
(inductor/decompose_attention.py), so `options={"quantization": ...}` reaches the Linears of a stock
`nn.MultiheadAttention` / `nn.TransformerEncoderLayer`: the rewritten graph against eager PyTorch on fresh random
inputs (masks of every documented form, both layouts, the fast path's own output), the calls it must leave whole
and why, and the quantized stock encoder end to end through the backend."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oasr_ops
from oasr_ops.inductor import fuse_quant, fuse_residual, quantize_pass, rewrite
from oasr_ops.inductor.backend import oasr_backend
from oasr_ops.inductor.decompose_attention import decompose_attention

E, H, L, B = 64, 4, 10, 3


@pytest.fixture(autouse=True)
def _no_fast_path():
    """PyTorch's fused inference fast path would hand Dynamo one native op per layer (not the call rewritten here)."""
    torch._dynamo.reset()
    old = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(old)


def _capture(fn, *args, **kwargs):
    """Compile `fn` with a backend that runs only `decompose_attention` (the graph then runs eagerly)."""
    reports = []

    def backend(gm, example_inputs):
        reports.append(decompose_attention(gm))
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        reports[-1].targets = targets  # type: ignore[attr-defined]
        return gm.forward

    with torch.no_grad():
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args, **kwargs)
    assert len(reports) == 1
    return out, reports[0]


def _mha(batch_first: bool, bias: bool = True) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    return nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first).eval()


def _x(batch_first: bool, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((B, L, E) if batch_first else (L, B, E), generator=g)


def _masks(kind: str) -> dict:
    g = torch.Generator().manual_seed(2)
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, 6:] = True  # one padded sequence
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    return {
        "none": {},
        "kpm_bool": {"key_padding_mask": kpm},
        "kpm_float": {"key_padding_mask": torch.zeros(B, L).masked_fill(kpm, float("-inf"))},
        "attn_bool_2d": {"attn_mask": causal},
        "attn_float_2d": {"attn_mask": torch.randn(L, L, generator=g)},
        "attn_float_3d": {"attn_mask": torch.randn(B * H, L, L, generator=g)},
        "both": {"attn_mask": causal, "key_padding_mask": kpm},
    }[kind]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind", ["none", "kpm_bool", "kpm_float", "attn_bool_2d", "attn_float_2d", "attn_float_3d",
                                  "both"])
def test_rewritten_attention_matches_pytorch(batch_first, kind):
    mha, x, masks = _mha(batch_first), _x(batch_first), _masks(kind)
    with torch.no_grad():
        want = mha(x, x, x, need_weights=False, **masks)[0]
    got, rep = _capture(lambda t: mha(t, t, t, need_weights=False, **masks)[0], x)
    assert len(rep.decomposed) == 1 and not rep.kept
    assert F.multi_head_attention_forward not in rep.targets
    assert F.scaled_dot_product_attention in rep.targets
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_need_weights_default_with_the_weights_unread_is_rewritten():
    """`mha(x, x, x)[0]`: need_weights defaults to True, but nobody reads the weights."""
    mha, x = _mha(False, bias=False), _x(False)
    with torch.no_grad():
        want = mha(x, x, x)[0]
    got, rep = _capture(lambda t: mha(t, t, t)[0], x)
    assert len(rep.decomposed) == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_causal_hint_uses_its_mask():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 4 * E, dropout=0.1).eval()
    x, causal = _x(False), nn.Transformer.generate_square_subsequent_mask(L)
    with torch.no_grad():
        want = layer(x, src_mask=causal, is_causal=True)
    got, rep = _capture(lambda t: layer(t, src_mask=causal, is_causal=True), x)
    assert len(rep.decomposed) == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case, why", [
    ("weights_read", "the attention weights are read"),
    ("cross", "cross-attention"),
    ("training_dropout", "dropout in training mode"),
    ("bias_kv", "bias_k is set"),
    ("zero_attn", "add_zero_attn"),
    ("kdim", "cross-attention"),
])
def test_calls_left_whole_say_why(case, why):
    torch.manual_seed(0)
    x, y = _x(False), _x(False, seed=5)
    mha = nn.MultiheadAttention(E, H, dropout=0.5 if case == "training_dropout" else 0.0,
                                add_bias_kv=case == "bias_kv", add_zero_attn=case == "zero_attn",
                                kdim=32 if case == "kdim" else None, vdim=32 if case == "kdim" else None)
    mha.train(case == "training_dropout")
    fn = {
        "weights_read": lambda t: (lambda o, w: o.sum() + w.sum())(*mha(t, t, t)),
        "cross": lambda t: mha(t, y, y)[0],
        "kdim": lambda t: mha(t, y[..., :32], y[..., :32])[0],
    }.get(case, lambda t: mha(t, t, t)[0])
    torch.manual_seed(3)
    with torch.no_grad():
        want = fn(x)
    torch.manual_seed(3)
    got, rep = _capture(fn, x)
    assert not rep.decomposed and len(rep.kept) == 1 and why in rep.kept[0]
    assert F.multi_head_attention_forward in rep.targets
    if case != "training_dropout":
        torch.testing.assert_close(got, want)


# ---- PyTorch's fused encoder-layer fast path (torch._transformer_encoder_layer_fwd) ------------------------------

@pytest.fixture
def fast_path():
    torch.backends.mha.set_fastpath_enabled(True)  # (the autouse fixture restores the setting)


def _fast_layer(norm_first: bool, activation: str) -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(E, H, 4 * E, batch_first=True, norm_first=norm_first,
                                      activation=activation).eval()


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("mask", ["none", "kpm", "causal"])
def test_fast_path_layer_spelt_out_matches_it(fast_path, norm_first, activation, mask):
    layer, x = _fast_layer(norm_first, activation), _x(True)
    kw = {"none": {}, "kpm": {"src_key_padding_mask": _masks("kpm_bool")["key_padding_mask"]},
          "causal": {"src_mask": nn.Transformer.generate_square_subsequent_mask(L)}}[mask]
    with torch.no_grad():
        want = layer(x, **kw)  # the fused fast path, eagerly
    got, rep = _capture(lambda t: layer(t, **kw), x)
    assert [d.split(": ")[1] for d in rep.decomposed] == ["_transformer_encoder_layer_fwd"] and not rep.kept
    assert torch._transformer_encoder_layer_fwd not in rep.targets
    assert F.layer_norm in rep.targets and F.scaled_dot_product_attention in rep.targets
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fast_path_layer_with_another_float_mask_follows_the_documented_rule(fast_path):
    """A float mask other than 0 / -inf: PyTorch's fast path computes something else (NaN here); the spelt-out
    layer adds the mask, as the documented path (fast path off) does."""
    layer, x = _fast_layer(True, "gelu"), _x(True)
    m = torch.randn(L, L, generator=torch.Generator().manual_seed(4))
    got, rep = _capture(lambda t: layer(t, src_mask=m), x)
    assert [d.split(": ")[1] for d in rep.decomposed] == ["_transformer_encoder_layer_fwd"]
    torch.backends.mha.set_fastpath_enabled(False)
    with torch.no_grad():
        want = layer(x, src_mask=m)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- through the backend: a stock encoder quantized in the graph ------------------------------------------------

@pytest.fixture
def db_env(tuning_env, fresh_inductor):
    """A tuning DB and an Inductor cache of the test's own (conftest / _fx_capture), the rewrite log emptied."""
    rewrite.clear_rewrite_log()
    return tuning_env


def _encoder(batch_first: bool) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 4 * E, batch_first=batch_first, norm_first=True, activation="gelu")
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(torch.bfloat16).eval()


@pytest.mark.slow
@pytest.mark.parametrize("batch_first", [False, True])
def test_stock_encoder_quantized_in_graph_every_linear_and_fused(db_env, batch_first):
    """`options={"quantization": "int8_w8a8", "fuse_quantization": True}` on a calibrated stock pre-norm encoder:
    every Linear is an int8 GEMM (the packed in-projection N = 3E included), each LayerNorm feeds its GEMM through
    `layer_norm_quant`, each GELU's quantization is in fc1's epilogue (through the eval dropout), each residual add
    in its GEMM's; the output within int8 accuracy of the fp32 model (the bf16 model's own error for scale)."""
    enc = _encoder(batch_first)
    x = _x(batch_first).to(torch.bfloat16)
    kpm = _masks("kpm_bool")["key_padding_mask"]
    with torch.no_grad():
        oasr_ops.calibrate(enc, [(_x(batch_first, seed=7).to(torch.bfloat16),)])
        ref = copy.deepcopy(enc).float()(x.float(), src_key_padding_mask=kpm)
        bf16 = enc(x, src_key_padding_mask=kpm)
        got = torch.compile(enc, backend=oasr_backend, options={"quantization": oasr_ops.Int8W8A8Config(layers="all"),
                                                                 "fuse_quantization": True})(
            x, src_key_padding_mask=kpm)
    shapes = sorted(s.signature.split("|", 2)[2] for s in rewrite.rewrite_log()[-1].sites
                    if s.family == "scaled_mm")
    assert shapes == sorted(2 * [f"N={n}|K={k}" for n, k in ((3 * E, E), (E, E), (4 * E, E), (E, 4 * E))])
    fused = fuse_quant.fuse_log()[-1]
    assert (fused.layer_norm_quant, fused.act_quant) == (4, 2)
    assert len(fused.unfused) == 2 and all("flatten" in u for u in fused.unfused)  # attention outputs: dynamic
    assert fuse_residual.residual_log()[-1].fused == 4
    scale = ref.abs().max()
    err, bf16_err = float((got.float() - ref).abs().max() / scale), float((bf16.float() - ref).abs().max() / scale)
    assert err < 3e-2, (err, bf16_err)


@pytest.mark.slow
def test_fast_path_encoder_quantized_in_graph(db_env, fast_path, monkeypatch):
    """`options={"quantization": ...}` on a batch-first stock encoder in eval under no_grad, PyTorch's fast path on:
    each layer was one native op the pass could not reach (one warning, nothing quantized); spelt out, its four
    Linears are int8 GEMMs and no fast-path warning is given."""
    reports = []

    def recording(gm):
        reports.append(decompose_attention(gm))
        return reports[-1]

    monkeypatch.setattr(quantize_pass, "decompose_attention", recording)
    enc = _encoder(True)
    x = _x(True).to(torch.bfloat16)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ref = copy.deepcopy(enc).float()(x.float())
        every = oasr_ops.Int8W8A8Config(layers="all")  # every qualifying layer, not the fusable ones only
        got = torch.compile(enc, backend=oasr_backend, options={"quantization": every})(x)
    assert not [w for w in seen if "fast path" in str(w.message)]
    assert [len(r.decomposed) for r in reports] == [2]
    assert all(d.endswith(": _transformer_encoder_layer_fwd") for d in reports[0].decomposed)
    shapes = sorted(s.signature.split("|", 2)[2] for s in rewrite.rewrite_log()[-1].sites if s.family == "scaled_mm")
    assert shapes == sorted(2 * [f"N={n}|K={k}" for n, k in ((3 * E, E), (E, E), (4 * E, E), (E, 4 * E))])
    assert float((got.float() - ref).abs().max() / ref.abs().max()) < 3e-2


def test_kept_attention_warns_once_under_quantization(db_env, monkeypatch):
    monkeypatch.setattr(quantize_pass, "_WARN", quantize_pass.WarnOnce())
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H).to(torch.bfloat16).eval()
    x, y = _x(False).to(torch.bfloat16), _x(False, seed=5).to(torch.bfloat16)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.compile(lambda t: mha(t, y, y)[0], backend=oasr_backend, options={"quantization": "int8_w8a8"})(x)
    msgs = [str(w.message) for w in seen if "kept whole" in str(w.message)]
    assert len(msgs) == 1 and "cross-attention" in msgs[0]
