"""fp8-quantized models through the graph path: the pass bakes scaled_mm_fp8 configs, the census of an
online-quantized model (`--quantization fp8_w8a8`) reports scaled_mm_fp8 sites, strict prewarm raises on an
uncovered fp8 point, and `options={"quantization": "fp8_w8a8"}` runs the ops quantize_ runs."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops import paths
from oasr_ops.inductor import rewrite
from oasr_ops.inductor.backend import oasr_backend
from oasr_ops.tune import database

SIG = "scaled_mm_fp8|op=scaled_mm_fp8|N=128|K=64"
SIG2 = "scaled_mm_fp8|op=scaled_mm_fp8|N=64|K=128"
TILE = "t64x128x128_c1x1_pp_fa"


@pytest.fixture
def db_env(tmp_path, monkeypatch):
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(tmp_path / "user"))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    monkeypatch.setattr(paths, "system_db_dir", lambda: tmp_path / "system")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    oasr_ops.reload_tuning()
    rewrite.clear_rewrite_log()
    yield tmp_path
    monkeypatch.undo()
    oasr_ops.reload_tuning()


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _quantized():
    torch.manual_seed(0)
    m = Two().to(torch.bfloat16).eval()
    return m, oasr_ops.quantize_(copy.deepcopy(m), "fp8_w8a8")


def test_pass_bakes_scaled_mm_fp8_configs(db_env):
    database.publish("scaled_mm_fp8", {SIG: {"regions": [[64, TILE], [None, "heuristic"]]}}, tier="user",
                     arch="sm90", lane="sm90_fp8_wgmma")
    oasr_ops.reload_tuning()
    _ref, q = _quantized()
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = q(x)
        got = torch.compile(q, backend=oasr_backend)(x)
    assert torch.equal(got, want)  # on the CPU every config runs the reference
    sites = {s.signature: s for s in rewrite.rewrite_log()[-1].sites if s.family == "scaled_mm_fp8"}
    assert sites[SIG].m == 20 and sites[SIG].config == TILE and sites[SIG].tier == "user"
    assert (sites[SIG2].tier, sites[SIG2].config) == ("default", "torch")  # untuned: torch._scaled_mm


def test_census_quantization_flag_reports_fp8_sites(tmp_path):
    from oasr_ops import cli

    man = tmp_path / "m.jsonl"
    man.write_text("".join(json.dumps({"duration": d}) + "\n" for d in (2.0, 3.3)))
    out = tmp_path / "q.json"
    assert cli.main(["tune", "census", "--model", "examples.conformer:build_model", "--model-args", "size=S",
                     "num_layers=1", "--service-mode", "offline", "--max-batch-size", "2", "--manifest", str(man),
                     "--max-keys", "4", "--quantization", "fp8_w8a8", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["quantization"] == "fp8_w8a8"
    sigs = set(doc["signatures"])
    assert "scaled_mm_fp8|op=scaled_mm_fp8|N=1024|K=256" in sigs  # FFN-1 of Conformer S, quantized to e4m3
    assert not any(s.startswith("scaled_mm|") for s in sigs)


def test_strict_prewarm_raises_on_uncovered_fp8_point(db_env):
    _ref, q = _quantized()
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    with pytest.raises(oasr_ops.UncoveredPointsError, match="scaled_mm_fp8"):
        oasr_ops.prewarm(q, (x,), oasr_ops.TuningConfig(strict=True))
    database.publish("scaled_mm_fp8", {SIG: {"regions": [[None, "heuristic"]]},
                                       SIG2: {"regions": [[None, "torch"]]}},
                     tier="user", arch="sm90", lane="sm90_fp8_wgmma")
    oasr_ops.reload_tuning()
    rep = oasr_ops.prewarm(q, (x,), oasr_ops.TuningConfig(strict=True))
    assert not rep.uncovered and len(rep.covered) == len(rep.points) >= 2


def test_backend_quantization_option_matches_quantize_(db_env):
    ref, q = _quantized()
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = q(x)
        every = oasr_ops.Fp8W8A8Config(layers="all")  # every qualifying layer, not the fusable ones only
        got = torch.compile(ref, backend=oasr_backend, options={"quantization": every})(x)
    # the same ops as quantize_ + eager; compiled code may round the activation quantization's inputs differently
    assert ((got.float() - want.float()).abs().max() / want.float().abs().max()).item() < 5e-2
    sites = [s for s in rewrite.rewrite_log()[-1].sites if s.family == "scaled_mm_fp8"]
    assert {s.signature for s in sites} == {SIG, SIG2}
    assert all(s.config != "auto" for s in sites)
