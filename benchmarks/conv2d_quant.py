"""The int8 speech frontend on the GPU, kernel by kernel: what the first conv's int8 output and the int8 second conv
save against the fp16 frontend (what `backend="oasr"` serves an fp16 model).

    python benchmarks/conv2d_quant.py --out conv2d_quant.json [--batch 16 --frames 1000 --channels 512]

Conformer M's Conv2dSubsampling4: conv1 = Conv2d(1, C, 3, stride 2) + ReLU on [B, T, 80] features (the direct
kernel, M = B * 499 * 39 positions), conv2 = Conv2d(C, C, 3, stride 2) + ReLU. Arms (each a CUDA graph of 8 calls,
median of 15 replays, --rounds alternating rounds, median over rounds; random operands):

  conv1-fp16        oasr.conv2d_activation (auto: the untuned rule's direct tile), fp16 out
  conv1-int8out     oasr.conv2d_activation_quant, the same tile writing int8 with a static scale
  conv1-fp16+quant  conv1-fp16 then Inductor's fused per-tensor quantization (what an unfused QuantConv2d costs)
  conv2-fp16        oasr.conv2d_activation on conv1's fp16 output (auto: cuDNN's fused conv + bias + ReLU)
  conv2-int8        oasr.conv2d_int8_activation on conv1's int8 output (auto: `ops_int8.untuned_tile`)
  conv2-int8@TILE   (--int8-tiles) the same on each tile of the int8 conv lane
  frontend-fp16     conv1-fp16 -> conv2-fp16
  frontend-int8     conv1-int8out -> conv2-int8
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaled_mm import time_alternating  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--mels", type=int, default=80)
    p.add_argument("--channels", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--int8-tiles", action="store_true",
                   help="also time conv2-int8 on every tile of the int8 conv lane (conv2-int8@<tile>): the data "
                        "behind `ops_int8.untuned_tile`")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import oasr_ops
    from oasr_ops.families.conv2d_activation.ops import quantize_output, served
    from oasr_ops.families.conv2d_activation.ops_int8 import quantize_conv_weight

    g = torch.Generator(device="cuda").manual_seed(0)
    c = a.channels
    feats = torch.randn(a.batch, a.frames, a.mels, 1, device="cuda", generator=g).half()  # NHWC, Cin = 1
    w1 = (torch.randn(c, 3, 3, 1, device="cuda", generator=g) / 3).half()
    b1 = (torch.randn(c, device="cuda", generator=g) * 0.1).half()
    w2 = (torch.randn(c, 3, 3, c, device="cuda", generator=g) / (9 * c) ** 0.5).half()
    b2 = (torch.randn(c, device="cuda", generator=g) * 0.1).half()
    w2q, sw2 = quantize_conv_weight(w2)
    with torch.no_grad():
        h = oasr_ops.conv2d_activation(feats, w1, b1, stride=2, activation="relu")
    s1 = (h.float().abs().amax() / 127.0).reshape(1)
    hq = oasr_ops.conv2d_activation_quant(feats, w1, s1, b1, stride=2, activation="relu")
    quant = torch.compile(lambda y, s: quantize_output(y, s))
    quant(h, s1)

    def conv1_fp16(_i):
        return oasr_ops.conv2d_activation(feats, w1, b1, stride=2, activation="relu")

    def conv1_int8(_i):
        return oasr_ops.conv2d_activation_quant(feats, w1, s1, b1, stride=2, activation="relu")

    def conv2_fp16(_i, x=h):
        return oasr_ops.conv2d_activation(x, w2, b2, stride=2, activation="relu")

    def conv2_int8(_i, x=hq):
        return oasr_ops.conv2d_int8_activation(x, w2q, s1, sw2, b2, stride=2, activation="relu")

    arms = {
        "conv1-fp16": conv1_fp16,
        "conv1-int8out": conv1_int8,
        "conv1-fp16+quant": lambda i: quant(conv1_fp16(i), s1),
        "conv2-fp16": conv2_fp16,
        "conv2-int8": conv2_int8,
        "frontend-fp16": lambda i: conv2_fp16(i, conv1_fp16(i)),
        "frontend-int8": lambda i: conv2_int8(i, conv1_int8(i)),
    }
    if a.int8_tiles:
        from oasr_ops.families.conv2d_activation.lanes import SM90_INT8_CONV2D

        for tile in SM90_INT8_CONV2D.ids():
            arms[f"conv2-int8@{tile}"] = (lambda t: lambda _i: oasr_ops.conv2d_int8_activation(
                hq, w2q, s1, sw2, b2, stride=2, activation="relu", config=t))(tile)
    # correctness of what is timed: the int8 frontend against the fp16 one (the same layer, int8 numerics)
    with torch.no_grad():
        ref = arms["frontend-fp16"](0).float()
        got = arms["frontend-int8"](0).float()
    rel = float((got - ref).abs().max() / ref.abs().max())
    med, per_round = time_alternating(arms, a.rounds, calls=8, reps=15)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "shape": {"batch": a.batch, "frames": a.frames, "mels": a.mels, "channels": a.channels},
           "int8_vs_fp16_frontend_rel_err": rel, "median_us": med, "round_us": per_round,
           "served": sorted({f"{p.signature} -> {p.config}" for p in served()})}
    for name, us in med.items():
        print(f"{name:18s} {us:9.1f} us", flush=True)
    print(f"frontend int8 vs fp16: {med['frontend-fp16'] / med['frontend-int8']:.2f}x; int8 rel. err {rel:.3g}")
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
