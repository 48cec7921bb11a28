"""The reference workloads in examples/: shapes, determinism, documented sizes, and clean dynamo capture.

CPU-only and small: Conformer S at 200 frames, Whisper tiny with 2 layers at its fixed 3000-frame window.
M/L and the bigger Whisper sizes are only built on the meta device (no memory, no forward).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# examples/ is a repo-root package, not installed: make it importable under a bare `pytest` too (where the
# root is not on sys.path), not only under `python -m pytest`.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from examples import conformer, whisper  # noqa: E402


def _nparams(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def conformer_s() -> torch.nn.Module:
    return conformer.build_model("S", dtype="fp32", device="cpu", seed=0)


@pytest.fixture(scope="module")
def whisper_tiny() -> torch.nn.Module:
    return whisper.build_model("tiny", dtype="fp32", device="cpu", seed=0, num_layers=2)


# ---- Conformer ---------------------------------------------------------------------------------------------

def test_conformer_forward_shape_and_finite(conformer_s: torch.nn.Module) -> None:
    (feats,) = conformer.example_inputs(batch=2, frames=200, dtype="fp32")
    assert feats.shape == (2, 200, 80)
    assert not conformer_s.training
    with torch.no_grad():
        out = conformer_s(feats)
    assert out.shape == (2, conformer.output_frames(200), 256) == (2, 49, 256)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_conformer_lengths_mask_matches_unpadded_run(conformer_s: torch.nn.Module) -> None:
    feats, lengths = conformer.example_inputs(batch=2, frames=200, dtype="fp32", with_lengths=True)
    assert lengths.tolist() == [200, 100]
    with torch.no_grad():
        out, out_lens = conformer_s(feats, lengths)
        alone = conformer_s(feats[1:, :100])
    assert out_lens.tolist() == [49, 24] == [conformer.output_frames(200), conformer.output_frames(100)]
    # Masking makes the padded utterance's real frames independent of what the padding holds.
    torch.testing.assert_close(out[1, :24], alone[0], rtol=1e-4, atol=1e-4)


def test_conformer_seed_determinism() -> None:
    a = conformer.build_model("S", dtype="fp32", seed=3, num_layers=2)
    b = conformer.build_model("S", dtype="fp32", seed="3", num_layers="2")  # CLI strings
    c = conformer.build_model("S", dtype="fp32", seed=4, num_layers=2)
    (x,) = conformer.example_inputs(batch=1, frames=64, dtype="fp32")
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
        assert not torch.allclose(a(x), c(x))


def test_conformer_sizes_documented() -> None:
    expect = {"S": (256, 4, 16, 26_205_184), "M": (512, 8, 16, 104_314_880), "L": (1024, 16, 17, 440_427_520)}
    for size, (d, heads, layers, nparams) in expect.items():
        m = conformer.build_model(size, dtype="fp16", device="meta")
        assert (m.d_model, m.config.num_heads, m.num_layers, len(m.blocks)) == (d, heads, layers, layers)
        assert m.blocks[0].ff1.fc1.out_features == 4 * d and m.blocks[0].conv.depthwise.kernel_size == (31,)
        assert _nparams(m) == nparams
    assert conformer.census_info["subsampling"] == 4 and conformer.census_info["fixed_window"] is None


def test_conformer_conv1d_form_matches_linear_form() -> None:
    """conv_impl="conv1d" (nn.Conv1d pointwise convs on (B, d, T), GLU(dim=1)) computes the Linear form."""
    lin = conformer.build_model("S", dtype="fp32", num_layers=2, seed=1)
    conv = conformer.build_model("S", dtype="fp32", num_layers=2, seed=1, conv_impl="conv1d")
    assert _nparams(lin) == _nparams(conv)
    assert isinstance(conv.blocks[0].conv.pointwise1, torch.nn.Conv1d)
    sd = {k: (v.reshape(conv.state_dict()[k].shape)) for k, v in lin.state_dict().items()}
    conv.load_state_dict(sd)
    feats, lengths = conformer.example_inputs(batch=2, frames=120, dtype="fp32", with_lengths=True)
    with torch.no_grad():
        a, la = lin(feats, lengths)
        b, lb = conv(feats, lengths)
    assert torch.equal(la, lb)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="conv_impl"):
        conformer.build_model("S", conv_impl="conv2d")


def test_dtype_and_arg_parsing() -> None:
    m = conformer.build_model(size="s", dtype="bf16", num_layers="1", fused_qkv="false", conv_norm="layer")
    assert next(m.parameters()).dtype == torch.bfloat16
    assert m.num_layers == 1 and not m.blocks[0].mhsa.fused_qkv
    assert conformer.build_model("S", dtype=torch.float16, num_layers=1).subsample.out.weight.dtype == torch.float16
    with pytest.raises(TypeError, match="unknown model argument"):
        conformer.build_model("S", n_layers=2)
    with pytest.raises(ValueError, match="unknown dtype"):
        conformer.build_model("S", dtype="int8")


def test_conformer_dynamo_no_graph_breaks(conformer_s: torch.nn.Module) -> None:
    torch._dynamo.reset()
    (feats,) = conformer.example_inputs(batch=2, frames=120, dtype="fp32")
    explain = torch._dynamo.explain(conformer_s)(feats)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    # And the compiled (eager-backend) module agrees with eager, including the masked path.
    feats, lengths = conformer.example_inputs(batch=2, frames=120, dtype="fp32", with_lengths=True)
    compiled = torch.compile(conformer_s, backend="eager", fullgraph=True)
    with torch.no_grad():
        got, got_lens = compiled(feats, lengths)
        ref, ref_lens = conformer_s(feats, lengths)
    torch.testing.assert_close(got, ref)
    assert torch.equal(got_lens, ref_lens)


# ---- Whisper -----------------------------------------------------------------------------------------------

def test_whisper_forward_shape_and_finite(whisper_tiny: torch.nn.Module) -> None:
    (mel,) = whisper.example_inputs(batch=2, dtype="fp32")
    assert mel.shape == (2, 80, whisper.FIXED_WINDOW_FRAMES) == (2, 80, 3000)
    with torch.no_grad():
        out = whisper_tiny(mel)
    assert out.shape == (2, 1500, 384) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="expects"):
        whisper_tiny(mel[:, :, :2000])
    with pytest.raises(ValueError, match="expects"):
        whisper_tiny(mel.transpose(1, 2))


def test_whisper_sizes_and_census() -> None:
    expect = {"tiny": (384, 6, 4, 7_632_384), "base": (512, 8, 6, 19_822_592), "small": (768, 12, 12, 87_002_112)}
    for size, (d, heads, layers, nparams) in expect.items():
        m = whisper.build_model(size, device="meta")
        assert (m.d_model, m.config.num_heads, m.num_layers, len(m.blocks)) == (d, heads, layers, layers)
        assert _nparams(m) == nparams
        assert m.blocks[0].mlp[0].out_features == 4 * d
    assert whisper.FIXED_WINDOW_FRAMES == 3000
    assert whisper.census_info == {**whisper.census_info, "frame_shift_ms": 10, "subsampling": 2,
                                   "fixed_window": 3000}
    assert whisper.output_frames() == 1500


def test_whisper_determinism_and_dynamo(whisper_tiny: torch.nn.Module) -> None:
    other = whisper.build_model("tiny", dtype="fp32", seed="0", num_layers="2")
    for (name, p), (_, q) in zip(whisper_tiny.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), name
    torch._dynamo.reset()
    (mel,) = whisper.example_inputs(batch=1, dtype="fp32")
    explain = torch._dynamo.explain(whisper_tiny)(mel)
    assert explain.graph_break_count == 0, explain.break_reasons


# ---- Manifest ----------------------------------------------------------------------------------------------

def test_manifest_reproducible() -> None:
    import json
    import runpy

    gen = runpy.run_path(str(Path(_ROOT) / "examples" / "manifests" / "make_manifest.py"))
    path = gen["DEFAULT_OUT"]
    assert path.read_text() == gen["render"]()  # committed file == generator output
    durations = [json.loads(line)["duration"] for line in path.read_text().splitlines()]
    assert len(durations) == 200 and all(1.0 <= d <= 30.0 for d in durations)
    assert 6.0 <= sorted(durations)[100] <= 8.5
