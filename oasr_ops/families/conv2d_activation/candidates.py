"""The conv2d_activation family's candidates and operands (the tuners' interface, `oasr_ops.families.candidate`).

Arms of ``conv2d_activation|op=<conv2d_k3s2|conv2d_k3s1|conv2d>|dt=..|N=<Cout>|K=<Cin*KH*KW>``: ``torch`` (cuDNN
through F.conv2d on channels_last views + the activation in place: the fallback, so a region names a kernel only
where it measured faster), ``fused`` (cuDNN's conv + bias + ReLU runtime fusion, `torch.cudnn_convolution_relu`;
on a CPU the op's reference), then the lane's configs feasible for (N, K): the direct kernel for K <= 196, the
CUTLASS implicit GEMM for K and N multiples of 8; each gated against the float64 conv at 4x cuDNN's own error.

Operands: a point's M = B * Ho * Wo is measured as one image (B = 1) of the frontend's width on 80 mel bins
(Wo = 39 after the first 3x3/2 conv, for K <= 36; Wo = 19 after the second) and Ho = ceil(M / Wo) rows: the
measured M is M rounded up to a whole row. The ``conv2d`` op (other geometries) is measured as a 3x3 stride-1
conv. Bias in x's dtype, ReLU (what the frontend fuses).
"""
from __future__ import annotations

from typing import Any

from ...runtime.registry import native_lane
from ..candidate import Candidate, Gate, Operands, lane_candidates

FAMILY = "conv2d_activation"
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "half": "float16"}
ACTIVATION = "relu"


def geometry(op: str, k: int) -> tuple[int, int, int]:
    """(kernel size, stride, Cin) of a signature's op and K."""
    stride = 2 if op == "conv2d_k3s2" else 1
    if k % 9:
        raise ValueError(f"{FAMILY}: K={k} is not Cin x 3 x 3")
    return 3, stride, k // 9


def image(op: str, k: int, m: int) -> tuple[int, int, int, int]:
    """(H, W, Ho, Wo) of the one-image operands of a point (module docstring)."""
    ks, stride, _ = geometry(op, k)
    wo = 39 if k <= 36 else 19
    ho = -(-m // wo)
    return (ho - 1) * stride + ks, (wo - 1) * stride + ks, ho, wo


def _bind(o: Operands, config: str, copy: int):
    import torch

    fn = torch.ops.oasr.conv2d_activation.default
    x, s = o.acts["x"], o.consts["stride"]
    w = o.weights[copy % o.copies]
    return lambda: fn(x, w["w"], w["b"], s, [0, 0], ACTIVATION, config)


def host_probe() -> tuple[int, int]:
    """(N, K) of the signature the build prices host issue cost on: the second frontend conv of Conformer S."""
    return 256, 256 * 9


def candidates(parts: Any, arch: str) -> list[Candidate]:
    """torch (cuDNN, the fallback), fused (cuDNN's conv + bias + ReLU fusion), then the lane's configs feasible for
    (Cout, K) on `arch`."""
    gate = Gate("tolerance", baseline="torch")
    out = lane_candidates(native_lane(arch, FAMILY), _bind, gate, parts.n, parts.k, arch)
    return out[:1] + [Candidate("fused", _bind, gate, host="torch")] + out[1:]


def operands(point: Any, device: Any, seed: int = 0, *, copies: int = 1, like: Operands | None = None) -> Operands:
    """x [1, H, W, Cin] ~ N(0, 1) in the point's dtype; w [Cout, 3, 3, Cin] ~ N(0, 1/K), bias ~ N(0, 1)."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, DTYPES.get(point.dtype, "float16"))
    ks, stride, cin = geometry(point.op, point.k)
    h, w_, _, _ = image(point.op, point.k, point.m)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    cout = point.n

    def make_w():
        return {"w": (torch.randn(cout, ks, ks, cin, generator=g, device=device) / point.k ** 0.5).to(dtype),
                "b": torch.randn(cout, generator=g, device=device).to(dtype)}

    x = torch.randn(1, h, w_, cin, generator=g, device=device, dtype=dtype)
    weights = like.weights if like is not None else [make_w() for _ in range(copies)]

    def reference():
        w0 = weights[0]
        y = F.conv2d(x.double().permute(0, 3, 1, 2), w0["w"].double().permute(0, 3, 1, 2), w0["b"].double(),
                     stride=stride)
        return torch.relu(y).permute(0, 2, 3, 1)

    return Operands(point, {"x": x}, {"stride": [stride, stride]}, weights, reference)
