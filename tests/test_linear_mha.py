"""`quantize_` on stock attention: `nn.MultiheadAttention` becomes `LinearMultiheadAttention` (its projections as
Linears the scheme swaps), the same forward as PyTorch's for every argument it takes, and `nn.TransformerEncoder*`
kept off the fused fast paths that would multiply dequantized copies of the quantized weights
(families/self_attention.py)."""
from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops.families.self_attention import LinearMultiheadAttention, convertible

E, H, L, S, B = 64, 4, 10, 7, 3


def _inputs(batch_first: bool, batched: bool, kind: str, seed: int = 1):
    g = torch.Generator().manual_seed(seed)

    def rnd(n):
        shape = ((B, n, E) if batch_first else (n, B, E)) if batched else (n, E)
        return torch.randn(shape, generator=g)

    q = rnd(L)
    if kind == "self":
        return q, q, q
    kv = rnd(S)
    return (q, kv, kv) if kind == "kv" else (q, kv, rnd(S))


def _masks(kind: str, batched: bool, src: int):
    g = torch.Generator().manual_seed(2)
    kpm = torch.zeros(B, src, dtype=torch.bool)
    kpm[1, src - 3:] = True
    out: dict = {}
    if "kpm" in kind:
        out["key_padding_mask"] = kpm if batched else kpm[1]
        if "float" in kind:
            out["key_padding_mask"] = torch.zeros(out["key_padding_mask"].shape).masked_fill(
                out["key_padding_mask"], float("-inf"))
    if "attn2d" in kind:
        out["attn_mask"] = torch.rand(L, src, generator=g) > 0.8
        out["attn_mask"][:, 0] = False  # no row fully masked (NaN in both)
    if "attn3d" in kind:
        out["attn_mask"] = torch.randn((B * H if batched else H), L, src, generator=g)
    return out


@pytest.mark.parametrize("batch_first, batched, kind, need_weights, average, masks", [
    (bf, bt, k, nw, av, m)
    for bf, bt, k, (nw, av), m in itertools.product(
        (False, True), (True, False), ("self", "kv", "qkv"), ((False, True), (True, True), (True, False)),
        ("", "kpm", "kpm_float+attn3d", "kpm+attn2d"))
    if bt or bf is False])  # batch_first does not apply to unbatched input
def test_same_forward_as_pytorch(batch_first, batched, kind, need_weights, average, masks):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H, batch_first=batch_first).eval()
    ours = LinearMultiheadAttention.from_module(mha)
    q, k, v = _inputs(batch_first, batched, kind)
    m = _masks(masks, batched, L if kind == "self" else S)
    with torch.no_grad():
        want = mha(q, k, v, need_weights=need_weights, average_attn_weights=average, **m)
        got = ours(q, k, v, need_weights=need_weights, average_attn_weights=average, **m)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    else:
        assert got[1] is None and want[1] is None


def test_shares_the_parameters_and_trains():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H, dropout=0.0, bias=False)
    ours = LinearMultiheadAttention.from_module(mha)
    assert ours.in_proj.weight is mha.in_proj_weight and ours.out_proj.weight is mha.out_proj.weight
    assert ours.in_proj.bias is None and ours.training
    x = _inputs(False, True, "self")[0].requires_grad_()
    ours(x, x, x, need_weights=False)[0].sum().backward()
    assert mha.in_proj_weight.grad is not None and x.grad is not None


def test_causal_hint_without_mask_is_refused_as_pytorch_does():
    mha = nn.MultiheadAttention(E, H)
    x = _inputs(False, True, "self")[0]
    with pytest.raises(RuntimeError, match="attn_mask"):
        LinearMultiheadAttention.from_module(mha)(x, x, x, is_causal=True)


def test_what_is_not_convertible_stays():
    assert not convertible(nn.MultiheadAttention(E, H, kdim=32, vdim=32))
    assert not convertible(nn.MultiheadAttention(E, H, add_bias_kv=True))
    assert not convertible(nn.MultiheadAttention(E, H, add_zero_attn=True))
    m = nn.Sequential(nn.MultiheadAttention(E, H, add_zero_attn=True))
    oasr_ops.quantize_(m, "int8_w8a8")
    assert type(m[0]) is nn.MultiheadAttention


def _encoder(batch_first: bool) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 4 * E, batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2).to(torch.bfloat16).eval()


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_quantize_reaches_the_attention_and_leaves_the_fast_path(scheme, batch_first):
    """Every projection quantized (the packed in-projection one [3E, E] layer) and the result within the scheme's
    accuracy of the fp32 model on the unpadded positions. On the batch-first encoder PyTorch's fused fast path
    (nested tensors under no_grad) used to run the layers with dequantized 16-bit copies of the weights: the one
    warning that reading `QuantLinear.weight` gives must not appear."""
    enc = _encoder(batch_first)
    ref = copy.deepcopy(enc).float()
    oasr_ops.quantize_(enc, scheme)
    quant = {n: type(m).__name__ for n, m in enc.named_modules() if "Quant" in type(m).__name__}
    assert set(quant) == {f"layers.{i}.{p}" for i in range(2) for p in
                          ("self_attn.in_proj", "self_attn.out_proj", "linear1", "linear2")}
    assert enc.layers[0].self_attn.in_proj.weight_q.shape == (3 * E, E)
    x = _inputs(batch_first, True, "self")[0].to(torch.bfloat16)
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, 6:] = True
    with torch.no_grad():
        want = ref(x.float(), src_key_padding_mask=kpm)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = enc(x, src_key_padding_mask=kpm)
    assert not [w for w in seen if "dequantized" in str(w.message)]
    valid = ~kpm if batch_first else ~kpm.T  # PyTorch's nested fast path leaves padded positions 0
    err = float((got.float() - want)[valid].abs().max() / want[valid].abs().max())
    assert err < (3e-2 if scheme == "int8_w8a8" else 1.5e-1), err


def test_an_attention_with_nothing_quantized_stays_stock():
    """embed_dim 40 (K % 16 != 0): no projection qualifies, so the module goes back to the stock one (its fast path
    kept where the layer holds nothing quantized); the layer's qualifying linear2 (K = 160) is quantized, so the
    layer is kept off its fused fast path all the same."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(40, 4).eval()
    assert oasr_ops.quantize_(mha, "int8_w8a8") is mha
    layer = nn.TransformerEncoderLayer(40, 4, 160, batch_first=True).to(torch.bfloat16).eval()
    oasr_ops.quantize_(layer, "int8_w8a8")
    assert type(layer.self_attn) is nn.MultiheadAttention
    assert type(layer.linear1) is nn.Linear and type(layer.linear2).__name__ == "QuantLinear"
    assert not layer.activation_relu_or_gelu
    plain = nn.TransformerEncoderLayer(40, 4, 40, batch_first=True).eval()  # nothing qualifies anywhere
    oasr_ops.quantize_(plain, "int8_w8a8")
    assert type(plain.self_attn) is nn.MultiheadAttention and plain.activation_relu_or_gelu


def test_filter_fn_sees_the_projections_by_name():
    enc = _encoder(False)
    asked: list[str] = []

    def only_ffn(module, fqn):
        asked.append(fqn)
        return "self_attn" not in fqn

    oasr_ops.quantize_(enc, "int8_w8a8", filter_fn=only_ffn)
    assert "layers.0.self_attn.in_proj" in asked and "layers.1.self_attn.out_proj" in asked
    assert type(enc.layers[0].self_attn) is nn.MultiheadAttention  # neither projection wanted: left as it was
    assert type(enc.layers[0].linear1).__name__ == "QuantLinear"
    # the layers hold quantized Linears: their fused fast path (dequantized copies) is refused
    assert not enc.layers[0].activation_relu_or_gelu and not enc.use_nested_tensor


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_cross_attention_through_a_quantized_in_proj_uses_its_rows(scheme):
    """A cross-attention call projects the query by the quantized in_proj's first E rows and key = value by the
    other 2E (one GEMM), not the whole [3E, E] layer per input: the rows' outputs are exactly the whole layer's
    columns (per-channel weights, the same per-token input quantization), and the result is within the scheme's
    accuracy of the fp32 module."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H).to(torch.bfloat16).eval()
    ref = copy.deepcopy(mha).float()
    q = oasr_ops.quantize_(mha, scheme)
    assert isinstance(q, LinearMultiheadAttention)
    x, kv, _ = (t.to(torch.bfloat16) for t in _inputs(False, True, "kv"))
    with torch.no_grad():
        assert torch.equal(q.in_proj.rows(0, E)(x), q.in_proj(x)[..., :E])
        assert torch.equal(q.in_proj.rows(E, 3 * E)(kv), q.in_proj(kv)[..., E:])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = q(x, kv, kv, need_weights=False)[0]
        want = ref(x.float(), kv.float(), kv.float(), need_weights=False)[0]
    assert float((got.float() - want).abs().max() / want.abs().max()) < (3e-2 if scheme == "int8_w8a8" else 1.5e-1)
    with pytest.raises(TypeError, match="no rows"):
        oasr_ops.QuantConv2d.rows(object.__new__(oasr_ops.QuantConv2d), 0, 1)


@pytest.mark.slow
def test_quantize_fusable_stock_encoder_compiles_to_the_fused_graph(tuning_env, fresh_inductor):
    """The issue-15 recipe on a stock pre-norm encoder: `fusable_filter` (now naming the packed in-projection,
    traced off the fast path, through the eval dropout) -> quantize_ -> calibrate -> backend="oasr" with
    fuse_quantization: each LayerNorm feeds its GEMM through layer_norm_quant, each GELU's quantization is in fc1's
    epilogue, each fc2's residual add in its GEMM; within int8 accuracy of the fp32 model."""
    from oasr_ops.inductor import fuse_quant, fuse_residual
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_quant import fusable_filter

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 4 * E, batch_first=True, norm_first=True, activation="gelu")
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(torch.bfloat16).eval()
    ref = copy.deepcopy(enc).float()
    x = _inputs(True, True, "self")[0].to(torch.bfloat16)
    chosen = fusable_filter(enc, x)
    assert chosen.layers == {f"layers.{i}.{p}" for i in range(2) for p in ("self_attn.in_proj", "linear1", "linear2")}
    oasr_ops.quantize_(enc, "int8_w8a8", filter_fn=chosen)
    with torch.no_grad():
        oasr_ops.calibrate(enc, [_inputs(True, True, "self", seed=9)[0].to(torch.bfloat16)])
        got = torch.compile(enc, backend=oasr_backend, options={"fuse_quantization": True})(x)
        want = ref(x.float())
    fused = fuse_quant.fuse_log()[-1]
    assert (fused.layer_norm_quant, fused.act_quant, fused.unfused) == (4, 2, [])
    assert fuse_residual.residual_log()[-1].fused == 2
    assert float((got.float() - want).abs().max() / want.abs().max()) < 3e-2


@pytest.mark.parametrize("scheme", [None, "int8_w8a8", "fp8_w8a8"])
def test_a_stock_attention_checkpoint_loads(scheme):
    """A state dict saved from the stock module (before `quantize_` converted it, e.g. a quantized model of an
    earlier version whose attention stayed 16-bit) loads into the converted one: renamed, and quantized where the
    projection is, the same as quantize_ on those weights."""
    torch.manual_seed(0)
    stock = nn.MultiheadAttention(E, H).to(torch.bfloat16).eval()
    torch.manual_seed(1)
    other = nn.MultiheadAttention(E, H).to(torch.bfloat16).eval()
    target = LinearMultiheadAttention.from_module(other)
    want = LinearMultiheadAttention.from_module(copy.deepcopy(stock))
    if scheme:
        target, want = oasr_ops.quantize_(target, scheme), oasr_ops.quantize_(want, scheme)
    target.load_state_dict(stock.state_dict())
    for k, v in want.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k
    x = _inputs(False, True, "self")[0].to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(target(x, x, x)[0], want(x, x, x)[0])
