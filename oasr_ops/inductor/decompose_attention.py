"""`F.multi_head_attention_forward` nodes of a Dynamo graph (and the fused encoder-layer fast path's, below) -> their
parts (`families/self_attention.py`): the packed in-projection `linear`, `scaled_dot_product_attention`, the
out-projection `linear`.

Why: Dynamo keeps `nn.MultiheadAttention`'s call — and that of every `nn.TransformerEncoderLayer` /
`nn.TransformerDecoderLayer` off PyTorch's fused fast path (batch_first=False, grad or autocast on) — as one node;
its Linears exist only after AOTAutograd has decomposed it, too late for the quantization pass, which runs on
Dynamo's graph. Spelt out, they are quantized like any Linear, and the fusion passes see a LayerNorm feeding the
in-projection. The quantization pass (`quantize_pass.quantize_graph`) runs this first; without quantization the
call is left whole (AOTAutograd yields the same GEMMs and the gemm rewrite serves them).

Rewritten: self-attention (query, key and value one node) with the packed in-projection, no bias_k / bias_v /
add_zero_attn / static k-v, no dropout (eval, or p = 0), and the attention weights unused (need_weights=False, or
nobody reads them). `is_causal` with its `attn_mask`: the mask is used (the hint promises it is causal). A
batch-first module's input transpose is looked through, so the in-projection reads the rows in place. Every other
call stays one node, its reason in the report (and one warning from the quantization pass).

PyTorch's fused inference fast path for a whole `nn.TransformerEncoderLayer` (eval under no_grad, batch_first),
`torch._transformer_encoder_layer_fwd`, is spelt out the same way when its mask is a float mask or none (the layer
hands it its masks as 0 / -inf floats, `F._canonical_mask`): the LayerNorms (`F.layer_norm`), the attention as
above, the residual adds, `linear -> relu | gelu -> linear`, in the layer's order (norm_first or not). The mask is
added, as the documented (non-fast) path does; the fast path itself computes a float mask other than 0 / -inf
differently (NaN on the CPU, torch 2.13). Under torch.compile `nn.MultiheadAttention` alone does not take its fast
path (`_native_multi_head_attention`): its call is the `F.multi_head_attention_forward` above. Whether a quantized
encoder beats the fast path it leaves is the model's to measure (docs/perf/e2e.md)."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.fx.operator_schemas import normalize_function
from torch.fx.proxy import GraphAppendingTracer, Proxy

from ..families.self_attention import additive_mask, self_attention

_MHA = (F.multi_head_attention_forward,)
_COPIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack")


@dataclass
class AttentionReport:
    decomposed: list[str] = field(default_factory=list)  # "node: op" of each call spelt out
    kept: list[str] = field(default_factory=list)        # "node: why it stayed one node"


def _value(n) -> torch.Tensor | None:
    v = n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _weights_read(node: torch.fx.Node) -> bool:
    """Whether anything reads the call's second output (the attention weights), or the result other than by
    ``[0]`` / ``[1]``."""
    for u in node.users:
        if not (u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1)):
            return True
        if u.args[1] == 1 and u.users:
            return True
    return False


def _why_kept(node: torch.fx.Node, a: dict) -> str | None:
    """Why `node` (bound arguments `a`) is not rewritten, or None."""
    q = a["query"]
    if not (q is a["key"] is a["value"]):
        return "cross-attention (query, key and value differ)"
    if a["use_separate_proj_weight"] or not isinstance(a["in_proj_weight"], torch.fx.Node):
        return "separate q / k / v projection weights"
    for name in ("bias_k", "bias_v", "static_k", "static_v"):
        if a[name] is not None:
            return f"{name} is set"
    if a["add_zero_attn"] is not False:
        return "add_zero_attn"
    if a["training"] is not False and a["dropout_p"] != 0:
        return "dropout in training mode"
    if a["is_causal"] is not False and a["attn_mask"] is None:
        return "is_causal without its attn_mask"
    if _weights_read(node):  # (a need_weights=False call read whole is left alone too)
        return "the attention weights are read"
    e, h = a["embed_dim_to_check"], a["num_heads"]
    if not (isinstance(e, int) and isinstance(h, int)) or h <= 0 or e % h:
        return f"embed_dim {e!r} and num_heads {h!r} are not static with embed_dim % num_heads == 0"
    qv = _value(q)
    if qv is None or qv.dim() != 3:
        return "the query is not a traced 3-D (batched) tensor"
    for name in ("attn_mask", "key_padding_mask"):
        m = a[name]
        if m is not None and _value(m) is None:
            return f"{name} has no traced value"
    return None


def _batch_first_source(q: torch.fx.Node) -> tuple[torch.fx.Node, bool]:
    """``x.transpose(1, 0)`` (what a batch-first `nn.MultiheadAttention` hands the call) -> (x, True), else
    (q, False): the in-projection then reads x's rows where they are (no copy of the transposed input)."""
    if q.op == "call_method" and q.target == "transpose" or q.op == "call_function" and q.target is torch.transpose:
        dims = q.args[1:]
        if len(dims) == 2 and set(dims) == {0, 1} and not q.kwargs:
            return q.args[0], True
    return q, False


def _fill_example_values(nodes: list[torch.fx.Node], like: torch.Tensor) -> None:
    """Each new node's ``example_value`` computed under the graph's fake mode (the later passes read shapes and
    dtypes there); a node whose inputs lack one is left without."""
    # the mode Dynamo traced in (`detect_fake_mode` would answer the backend's tracing context's, another one)
    fake_mode = getattr(like, "fake_mode", None)
    if fake_mode is None:
        return
    for n in nodes:
        missing = []

        def val(x):
            if isinstance(x, torch.fx.Node):
                if "example_value" not in x.meta:
                    missing.append(x)
                return x.meta.get("example_value")
            return x

        args, kwargs = torch.fx.node.map_aggregate(n.args, val), torch.fx.node.map_aggregate(n.kwargs, val)
        if missing:
            continue
        fn = getattr(args[0], n.target) if n.op == "call_method" else n.target
        try:  # metadata only: a value it cannot compute leaves the later passes' shape checks undecided, never wrong
            with fake_mode:
                n.meta["example_value"] = fn(*(args[1:] if n.op == "call_method" else args), **kwargs)
        except Exception:  # noqa: BLE001 (AOTAutograd traces the graph again and reports a real error itself)
            continue


_ENCODER_LAYER = torch._transformer_encoder_layer_fwd


def _arguments(node: torch.fx.Node) -> dict | None:
    """The call's arguments by name, defaults filled (torch.fx's `normalize_function`), or None when they do not
    bind."""
    try:
        pair = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    except (TypeError, RuntimeError):
        return None
    return None if pair is None else dict(pair.kwargs)


def _adopt(g: torch.fx.Graph, node: torch.fx.Node, known: set, like: torch.Tensor) -> None:
    """The nodes emitted for `node` (those of `g` not in `known`): its provenance metadata and their traced
    values (`_fill_example_values`)."""
    new = [n for n in g.nodes if n not in known]
    for n in new:
        n.meta.update({k: node.meta[k] for k in _COPIED_META if k in node.meta})
    _fill_example_values(new, like)


def _fast_path_mask(mask, mask_type, proxy) -> tuple[object, str | None]:
    """The fast path's merged mask as `scaled_dot_product_attention`'s additive mask: type 0 [L, S], type 1
    (key padding) [B, S], type 2 [B, H, L, S]; (mask, None) or (None, why not)."""
    if mask is None:
        return None, None
    v = _value(mask)
    if v is None or not v.is_floating_point():
        return None, "its mask is not a traced float (additive) mask"
    shape = {0: 2, 1: 2, 2: 4}.get(mask_type)
    if shape != v.dim():
        return None, f"mask_type {mask_type!r} with a {v.dim()}-D mask"
    m = proxy(mask)
    return (m[None, None] if mask_type == 0 else m[:, None, None, :] if mask_type == 1 else m), None


def _encoder_layer(a: dict, proxy) -> tuple[object | None, str | None]:
    """`torch._transformer_encoder_layer_fwd`'s computation on proxies (the module docstring), or why not."""
    mask, why = _fast_path_mask(a["mask"], a["mask_type"], proxy)
    if why:
        return None, why
    e, h, eps = a["embed_dim"], a["num_heads"], a["eps"]
    p = {k: proxy(a[k]) for k in ("qkv_weight", "qkv_bias", "proj_weight", "proj_bias", "norm_weight_1",
                                  "norm_bias_1", "norm_weight_2", "norm_bias_2", "ffn_weight_1", "ffn_bias_1",
                                  "ffn_weight_2", "ffn_bias_2")}
    act = F.gelu if a["use_gelu"] else F.relu

    def attention(t):
        return self_attention(t, lambda u: F.linear(u, p["qkv_weight"], p["qkv_bias"]),
                              lambda u: F.linear(u, p["proj_weight"], p["proj_bias"]), h, mask, batch_first=True)

    def ffn(t):
        return F.linear(act(F.linear(t, p["ffn_weight_1"], p["ffn_bias_1"])), p["ffn_weight_2"], p["ffn_bias_2"])

    def norm(t, i):
        return F.layer_norm(t, (e,), p[f"norm_weight_{i}"], p[f"norm_bias_{i}"], eps)

    x = proxy(a["src"])
    if a["norm_first"]:
        x = x + attention(norm(x, 1))
        return x + ffn(norm(x, 2)), None
    x = norm(x + attention(x), 1)
    return norm(x + ffn(x), 2), None


def _decompose_fast_path(g: torch.fx.Graph, node: torch.fx.Node, proxy, rep: AttentionReport) -> None:
    """One fast-path node spelt out in place, or its reason in `rep.kept`."""
    a = _arguments(node)
    src = None if a is None else a["src"]
    if a is None or _value(src) is None or _value(src).dim() != 3:
        rep.kept.append(f"{node.name}: not a call on a traced 3-D input this pass understands")
        return
    if not (isinstance(a["embed_dim"], int) and isinstance(a["num_heads"], int)):
        rep.kept.append(f"{node.name}: embed_dim / num_heads are not static")
        return
    known = set(g.nodes)
    with g.inserting_before(node):
        out, why = _encoder_layer(a, proxy)
    if why:  # decided before anything was emitted
        rep.kept.append(f"{node.name}: {why}")
        return
    _adopt(g, node, known, _value(src))
    node.replace_all_uses_with(out.node)
    g.erase_node(node)
    rep.decomposed.append(f"{node.name}: {node.target.__name__}")


def decompose_attention(gm: torch.fx.GraphModule) -> AttentionReport:
    """Rewrite `gm`'s qualifying attention calls in place (module docstring)."""
    rep = AttentionReport()
    g = gm.graph
    tracer = GraphAppendingTracer(g)

    def proxy(n):
        return None if n is None else Proxy(n, tracer)

    for node in list(g.nodes):
        if node.op == "call_function" and node.target is _ENCODER_LAYER:
            _decompose_fast_path(g, node, proxy, rep)
            continue
        if node.op != "call_function" or node.target not in _MHA:
            continue
        a = _arguments(node)
        why = "its arguments do not bind to F.multi_head_attention_forward's" if a is None else _why_kept(node, a)
        if why:
            rep.kept.append(f"{node.name}: {why}")
            continue
        src, batch_first = _batch_first_source(a["query"])
        known = set(g.nodes)
        with g.inserting_before(node):
            mask = additive_mask(proxy(a["attn_mask"]), proxy(a["key_padding_mask"]), a["num_heads"],
                                 _value(a["query"]).dtype, attn_mask_like=_value(a["attn_mask"]),
                                 key_padding_mask_like=_value(a["key_padding_mask"]))
            w_in, b_in, w_out, b_out = (proxy(a[k]) for k in ("in_proj_weight", "in_proj_bias", "out_proj_weight",
                                                             "out_proj_bias"))
            out = self_attention(proxy(src), lambda t: F.linear(t, w_in, b_in), lambda t: F.linear(t, w_out, b_out),
                                 a["num_heads"], mask, batch_first).node
        outputs = [u for u in node.users if u.args[1] == 0]
        if batch_first:  # the call returned [L, B, E]; the module transposes it back: both transposes cancel
            back = [t for u in outputs for t in u.users if _batch_first_source(t) == (u, True)]
            for t in back:
                t.replace_all_uses_with(out)
                g.erase_node(t)
            if any(u.users for u in outputs):
                with g.inserting_after(out):
                    out = g.call_method("transpose", (out, 0, 1))
        _adopt(g, node, known, _value(a["query"]))
        for u in list(node.users):
            if u in outputs:
                u.replace_all_uses_with(out)
            g.erase_node(u)
        g.erase_node(node)
        rep.decomposed.append(f"{node.name}: {node.target.__name__}")
    if rep.decomposed:
        g.lint()
        gm.recompile()
    return rep
