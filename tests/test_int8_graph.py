"""Quantized models through the graph path: the pass bakes scaled_mm configs like gemm ones, the census of a
quantized (or online-quantized) model reports scaled_mm sites, strict prewarm raises on an uncovered int8 point."""
from __future__ import annotations

import copy
import dataclasses
import json
import warnings

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops import paths
from oasr_ops.families.scaled_mm.qconfig import as_quant_config
from oasr_ops.inductor import rewrite
from oasr_ops.inductor.backend import oasr_backend
from oasr_ops.tune import database

SIG = "scaled_mm|op=scaled_mm|N=128|K=64"
TILE = "t64x128x128_c1x1_pp"


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
    return m, oasr_ops.quantize_(copy.deepcopy(m), "int8_w8a8")


def _every_layer(scheme: str):
    """The in-graph quantization of every qualifying layer (the scheme string alone takes the fusable ones)."""
    return dataclasses.replace(as_quant_config(scheme), layers="all")


def test_pass_bakes_scaled_mm_configs(db_env):
    database.publish("scaled_mm", {SIG: {"regions": [[64, TILE], [None, "heuristic"]]}}, tier="user", arch="sm90",
                     lane="sm90_int8_wgmma")
    oasr_ops.reload_tuning()
    ref, q = _quantized()
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = q(x)
        got = torch.compile(q, backend=oasr_backend)(x)
    assert torch.equal(got, want)  # every config computes the same bits, the CPU reference too
    sites = {s.signature: s for s in rewrite.rewrite_log()[-1].sites if s.family == "scaled_mm"}
    assert sites[SIG].m == 20 and sites[SIG].config == TILE and sites[SIG].tier == "user"
    other = sites["scaled_mm|op=scaled_mm|N=64|K=128"]
    assert other.tier == "heuristic" and other.config != "auto"


def test_census_quantization_flag_reports_scaled_mm_sites(tmp_path):
    from oasr_ops import cli

    man = tmp_path / "m.jsonl"
    man.write_text("".join(json.dumps({"duration": d}) + "\n" for d in (2.0, 3.3)))
    out = tmp_path / "q.json"
    assert cli.main(["tune", "census", "--model", "examples.conformer:build_model", "--model-args", "size=S",
                     "num_layers=1", "--service-mode", "offline", "--max-batch-size", "2", "--manifest", str(man),
                     "--max-keys", "4", "--quantization", "int8_w8a8", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["quantization"] == "int8_w8a8"
    sigs = set(doc["signatures"])
    assert "scaled_mm|op=scaled_mm|N=1024|K=256" in sigs  # FFN-1 of Conformer S, quantized
    assert not any(s.startswith("gemm|") for s in sigs)  # every Linear of it qualifies


def test_strict_prewarm_raises_on_uncovered_int8_point(db_env):
    _ref, q = _quantized()
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    with pytest.raises(oasr_ops.UncoveredPointsError, match="scaled_mm"):
        oasr_ops.prewarm(q, (x,), oasr_ops.TuningConfig(strict=True))
    database.publish("scaled_mm", {SIG: {"regions": [[None, "heuristic"]]},  # measured: covered
                                   "scaled_mm|op=scaled_mm|N=64|K=128": {"regions": [[None, "heuristic"]]}},
                     tier="user", arch="sm90", lane="sm90_int8_wgmma")
    oasr_ops.reload_tuning()
    rep = oasr_ops.prewarm(q, (x,), oasr_ops.TuningConfig(strict=True))
    assert not rep.uncovered and len(rep.covered) == len(rep.points) >= 2


def test_backend_quantization_option_matches_quantize_(db_env):
    ref, q = _quantized()
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = q(x)  # quantize_ then eager: the same per-channel weights, per-token activations
        every = oasr_ops.Int8W8A8Config(layers="all")  # every qualifying layer, not the fusable ones only
        got = torch.compile(ref, backend=oasr_backend, options={"quantization": every})(x)
    # the same ops as quantize_ + eager; compiled code may round the activation quantization's inputs
    # differently, so compare at int8 accuracy (bitwise on this CPU build, not a contract)
    assert ((got.float() - want.float()).abs().max() / want.float().abs().max()).item() < 2e-2
    sites = [s for s in rewrite.rewrite_log()[-1].sites if s.family == "scaled_mm"]
    assert {s.signature for s in sites} == {SIG, "scaled_mm|op=scaled_mm|N=64|K=128"}
    assert all(s.config != "auto" for s in sites)
    with pytest.raises(Exception, match="quantization"):
        torch.compile(Two().to(torch.bfloat16), backend=oasr_backend, options={"quantization": "int4"})(x)


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_the_scheme_string_quantizes_the_fusable_layers_and_says_what_it_left(db_env, monkeypatch, scheme):
    """``options={"quantization": "int8_w8a8"}`` means ``layers="fusable"``: in LayerNorm -> fc1 -> GELU -> fc2 the
    layer after the LayerNorm is quantized and fc2 waits for a calibrated scale (one warning naming the remedy);
    calibrated, both are and nothing is said; a model with no LayerNorm -> Linear gets nothing quantized and one
    warning saying so (it would otherwise run in 16 bits without a word); ``layers="all"`` takes its layers."""
    from oasr_ops.inductor import quantize_pass

    monkeypatch.setattr(quantize_pass, "_WARN", quantize_pass.WarnOnce())
    op = "scaled_mm_fp8" if scheme == "fp8_w8a8" else "scaled_mm"
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)

    def compiled(model, quantization=scheme):
        torch._dynamo.reset()
        with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.compile(model, backend=oasr_backend, options={"quantization": quantization})(x)
        shapes = sorted(s.signature.split("|", 2)[2] for s in rewrite.rewrite_log()[-1].sites if s.family == op)
        return shapes, [str(w.message) for w in seen if str(w.message).startswith("options['quantization']")]

    torch.manual_seed(0)
    block = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    block = block.to(torch.bfloat16).eval()
    shapes, msgs = compiled(block)
    assert shapes == ["N=128|K=64"]
    assert len(msgs) == 1 and "1 Linear layer(s) after GELU/SiLU" in msgs[0] and "calibrate" in msgs[0], msgs
    oasr_ops.calibrate(block, [x])
    shapes, msgs = compiled(block)
    assert shapes == ["N=128|K=64", "N=64|K=128"] and not msgs, msgs
    plain = Two().to(torch.bfloat16).eval()
    shapes, msgs = compiled(plain)
    assert shapes == [] and len(msgs) == 1 and "none of the model's 2 qualifying Linear layer(s)" in msgs[0], msgs
    assert "layers='all'" in msgs[0]
    shapes, msgs = compiled(plain, _every_layer(scheme))
    assert shapes == ["N=128|K=64", "N=64|K=128"] and not msgs, msgs


def test_in_graph_quantization_of_a_float32_model_says_it_did_nothing(db_env, monkeypatch):
    """options={"quantization": ...} on a float32 model: the rewrite quantizes fp16 / bf16 layers only, and used to
    leave this model unquantized without a word; one warning now says so and what to do."""
    from oasr_ops.inductor import quantize_pass

    monkeypatch.setattr(quantize_pass, "_WARN", quantize_pass.WarnOnce())
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(UserWarning, match="2 Linear layer.*float32 weights left unquantized"):
        torch.compile(Two().eval(), backend=oasr_backend, options={"quantization": "int8_w8a8"})(
            torch.randn(2, 10, 64))


def test_in_graph_quantization_under_autocast_keeps_the_linear_output_dtype(db_env):
    """A bf16 model called with an fp32 input under autocast: each Linear returns bf16, and so must its in-graph
    int8 replacement (it returned the input's fp32)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).to(torch.bfloat16).eval()
    x = torch.randn(4, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = m(x)
        got = torch.compile(m, backend=oasr_backend, options={"quantization": "int8_w8a8"})(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert float((got.float() - want.float()).abs().max() / want.float().abs().max()) < 3e-2


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_in_graph_quantization_of_a_float32_model_under_autocast(db_env, scheme):
    """An fp32 model called under autocast: its Linears return bf16, so the model computes them in 16 bits anyway;
    the rewrite quantizes them too (weights quantized from fp32, the bias cast to the GEMM's dtype), where it used
    to leave every layer unquantized with a warning. The output keeps autocast's dtype; a LayerNorm autocast runs
    in fp32 still feeds its GEMM through layer_norm_quant."""
    from oasr_ops.inductor import fuse_quant

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
    x = torch.randn(4, 10, 64)
    with torch.no_grad():
        ref = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = m(x)
            got = torch.compile(m, backend=oasr_backend, options={"quantization": _every_layer(scheme),
                                                                   "fuse_quantization": True})(x)
    assert got.dtype == want.dtype == torch.bfloat16
    op = "scaled_mm_fp8" if scheme == "fp8_w8a8" else "scaled_mm"
    assert sorted(s.signature for s in rewrite.rewrite_log()[-1].sites) == [
        f"{op}|op={op}|N=128|K=64", f"{op}|op={op}|N=64|K=128"]
    assert fuse_quant.fuse_log()[-1].layer_norm_quant == 1
    err = float((got.float() - ref).abs().max() / ref.abs().max())
    assert err < (3e-2 if scheme == "int8_w8a8" else 1e-1), err


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_quantized_layers_of_a_float32_model_return_autocasts_dtype(scheme):
    """`quantize_` on an fp32 model, run eagerly under autocast: each quantized layer returns what its nn.Linear
    returned there (bf16), not the input's fp32 (the kernel's 16-bit output was cast up between layers); outside
    autocast it returns fp32 as before. The rows of a packed projection (`rows`) follow the same rule."""
    import oasr_ops

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
    x = torch.randn(4, 10, 64)
    with torch.no_grad():
        ref = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = m(x)
        q = oasr_ops.quantize_(copy.deepcopy(m), scheme)
        assert q(x).dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = q(x)
            hidden = q[0](x)
            part = q[0].rows(0, 64)(x)
    assert got.dtype == want.dtype == hidden.dtype == part.dtype == torch.bfloat16
    assert torch.equal(part, hidden[..., :64])
    err = float((got.float() - ref).abs().max() / ref.abs().max())
    assert err < (3e-2 if scheme == "int8_w8a8" else 1e-1), err
