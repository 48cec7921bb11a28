"""The census of a calibrated, fused quantized deployment (`oasr tune census --quantization S --calibrated`): each
FFN fc1 whose fc2 is quantized too is recorded under the op its fused GEMM reads (oasr_ops/tune/census_fused.py),
every other site as traced; the build reads those points."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from oasr_ops import cli
from oasr_ops.quantize import quantize_
from oasr_ops.tune import census as C
from oasr_ops.tune.build import load_works
from oasr_ops.tune.census_fused import act_quant_pairs
from oasr_ops.tune.prebuild import census_plan
from test_cli import _usage_error, home  # noqa: F401  (home: the fixture)

FC1, FC2 = "N=1024|K=256", "N=256|K=1024"  # Conformer S's FFN: Linear(d, 4d) + SiLU, Linear(4d, d)


def _census(tmp_path, scheme: str, *extra: str) -> dict:
    out = tmp_path / f"{scheme}{'-'.join(extra)}.json"
    assert cli.main(["tune", "census", "--model", "examples.conformer:build_model", "--model-args", "size=S",
                     "num_layers=1", "--quantization", scheme, *extra, "--service-mode", "offline",
                     "--max-batch-size", "4", "--max-seconds", "4", "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("scheme,family", [("int8_w8a8", "scaled_mm"), ("fp8_w8a8", "scaled_mm_fp8")])
def test_calibrated_census_records_the_fc1s_under_the_act_quant_op(tmp_path, scheme, family):
    plain, fused = _census(tmp_path, scheme), _census(tmp_path, scheme, "--calibrated")
    op, quant_op = family, f"{family}_quant"
    fc1_plain, fc1_fused = f"{family}|op={op}|{FC1}", f"{family}|op={quant_op}|{FC1}"
    assert fc1_plain in plain["signatures"] and fc1_fused not in plain["signatures"]
    assert fc1_fused in fused["signatures"] and fc1_plain not in fused["signatures"]
    # the same points, under the other op: every call of the fc1 runs fused
    assert fused["signatures"][fc1_fused]["points"] == plain["signatures"][fc1_plain]["points"]
    assert fused["signatures"][fc1_fused]["op"] == quant_op
    # fc2 (its input is fused into fc1's epilogue, its GEMM is the plain one) and every other site as traced
    others = {s: v for s, v in plain["signatures"].items() if s != fc1_plain}
    assert {s: v for s, v in fused["signatures"].items() if s != fc1_fused} == others
    assert f"{family}|op={op}|{FC2}" in others
    assert fused["calibrated"] is True and plain["calibrated"] is False
    assert fused["act_quant_pairs"] == {"blocks.0.ff1.fc2": "blocks.0.ff1.fc1", "blocks.0.ff2.fc2": "blocks.0.ff2.fc1"}
    # the family's build measures them under that op
    path, plain_path = tmp_path / "fused.json", tmp_path / "plain.json"
    path.write_text(json.dumps(fused))
    plain_path.write_text(json.dumps(plain))
    works = load_works([str(path)], family)
    assert fc1_fused in works and [p.m for p in works[fc1_fused].points] == \
        [p["m"] for p in fused["signatures"][fc1_fused]["points"]]
    # and `oasr tune prebuild --census` compiles the launchers that build times for them: the fused fc1's
    # (candidates.BUILD_ACTIVATION, session 39), not the plain quantizing op's
    out_dt = {"scaled_mm": "int8_gelu", "scaled_mm_fp8": "fp8_gelu"}[family]
    assert (family, out_dt) in census_plan([str(path)], "sm90", family=family)
    assert (family, out_dt) not in census_plan([str(plain_path)], "sm90", family=family)


class _TwoFFNs(nn.Module):
    """Two LayerNorm -> fc1 -> GELU -> fc2 blocks; the second's fc2 (N = 60) is one `quantize_` cannot quantize."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(80, 64)
        self.ln_a, self.fc1_a, self.fc2_a = nn.LayerNorm(64), nn.Linear(64, 256), nn.Linear(256, 64)
        self.ln_b, self.fc1_b, self.fc2_b = nn.LayerNorm(64), nn.Linear(64, 128), nn.Linear(128, 60)

    def forward(self, x):
        x = self.proj(x)
        x = x + self.fc2_a(nn.functional.gelu(self.fc1_a(self.ln_a(x))))
        return self.fc2_b(nn.functional.gelu(self.fc1_b(self.ln_b(x))))


def test_an_fc1_whose_fc2_stays_in_16_bits_is_not_fused():
    torch.manual_seed(0)
    model = _TwoFFNs().half().eval()
    make, _dims = C.input_maker(model, {})
    pairs = act_quant_pairs(model, make)
    assert pairs == {"fc2_a": "fc1_a", "fc2_b": "fc1_b"}  # found before quantization: fc2_b is still a Linear
    q = quantize_(model, "int8_w8a8")
    assert isinstance(q.fc2_b, nn.Linear) and not isinstance(q.fc2_a, nn.Linear)
    sigs = C.census_for_model(q, {}, service_mode="streaming", max_batch_size=2, chunk_frames=9,
                              act_quant_pairs=pairs).to_json()["signatures"]
    assert "scaled_mm|op=scaled_mm_quant|N=256|K=64" in sigs  # fc1_a: its fc2 is int8, the epilogue writes it
    assert "scaled_mm|op=scaled_mm|N=128|K=64" in sigs  # fc1_b: its fc2 is fp16, nothing to fuse into
    assert "scaled_mm|op=scaled_mm_quant|N=128|K=64" not in sigs
    assert "scaled_mm|op=scaled_mm|N=64|K=80" in sigs  # proj: no pair at all


def test_pairs_are_found_without_touching_the_model():
    model = _TwoFFNs().half()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    act_quant_pairs(model, C.input_maker(model, {})[0])
    after = model.state_dict()
    assert all(after[k].device.type == "cpu" and torch.equal(after[k], v) for k, v in before.items())


def test_calibrated_without_quantization_is_a_usage_error(home, capsys):  # noqa: F811  (home: the fixture)
    _usage_error(home, capsys, ["tune", "census", "--model", "examples.conformer:build_model", "--calibrated",
                                "--service-mode", "streaming", "--max-batch-size", "2",
                                "--out", str(home / "in" / "c.json")], "--calibrated", "--quantization")


@pytest.mark.parametrize("act,fused", [("GELU", True), ("ReLU", False)])
def test_any_linear_act_linear_is_a_pair_and_none_is_said(tmp_path, capsys, act, fused):
    """No LayerNorm before fc1: the pass fuses it all the same (GELU / SiLU only); without a pair, one warning."""
    src = tmp_path / f"ffn_{act.lower()}.py"  # a file name per case: the loader imports it by its stem
    src.write_text("import torch\n\ndef build_model(device='cpu', dtype=torch.float16):\n"
                   f"    return torch.nn.Sequential(torch.nn.Linear(80, 64), torch.nn.{act}(), torch.nn.Linear(64, 48))"
                   ".to(device, dtype)\n")
    out = tmp_path / "c.json"
    assert cli.main(["tune", "census", "--model", f"{src}:build_model", "--quantization", "int8_w8a8",
                     "--calibrated", "--service-mode", "streaming", "--max-batch-size", "2", "--chunk-frames", "9",
                     "--out", str(out)]) == 0
    said = "warning: --calibrated" in capsys.readouterr().err  # the CLI's own stderr handler
    doc = json.loads(out.read_text())
    assert said is not fused and doc["act_quant_pairs"] == ({"2": "0"} if fused else {})
    fc1 = "scaled_mm|op={}|N=64|K=80".format("scaled_mm_quant" if fused else "scaled_mm")
    assert fc1 in doc["signatures"] and "scaled_mm|op=scaled_mm|N=48|K=64" in doc["signatures"]
