"""The host-time tools run end to end on the CPU: benchmarks/host_overhead.py (stub kernels, `oasr::gemm`'s C++ hot
path built with the host compiler against the installed torch) and benchmarks/e2e_serving.py's CPU smoke path
(dynamic shapes through both backends, the timed parts skipped)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=900)


@pytest.mark.slow
def test_host_overhead_with_the_hot_path(tmp_path, hot_path_jit):
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, "benchmarks/host_overhead.py", "--calls", "20", "--blocks", "1", "--hot-path",
                        "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env={**os.environ, "OASR_JIT_DIR": str(hot_path_jit)})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["us_per_call"]
    answered = json.loads(out.read_text())["cpp_answered_calls"]
    served = ("gemm", "gemm_torch_arm", "scaled_mm", "scaled_mm_act_quant", "scaled_mm_residual", "conv1d_depthwise",
              "layer_norm_quant")
    assert set(rows) >= set(served)
    for name in served:  # the ops the C++ hot path serves: timed through it, every call after the first answered there
        assert set(rows[name]) == {"impl", "op", "cpp_op"} and all(v > 0 for v in rows[name].values()), name
        assert answered[name] == 200 + 20 - 1, (name, answered[name])  # warm-up + one block of calls, less the miss
    for name in ("floor", "aten/addmm_small"):
        assert rows[name]["op"] > 0, name


@pytest.mark.slow
def test_e2e_serving_cpu_smoke(tmp_path):
    out = tmp_path / "serving.json"
    r = _run("benchmarks/e2e_serving.py", "--device", "cpu", "--model-args", "size=S,num_layers=2",
             "--variants", "fp16,fp16-oasr,fp16-oasr-floor19", "--requests", "2", "--batches", "1,2", "--max-s", "2.5",
             "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["graphs"]) == {"fp16", "fp16-oasr", "fp16-oasr-floor19"}
    assert all(e < 1e-2 for e in res["worst_rel_err"].values())


@pytest.mark.slow
def test_e2e_serving_cpu_smoke_fixed_window(tmp_path):
    """The Whisper-style interface: (mel,) padded to the fixed window, every output position compared; the int8
    and fp8 recipes (fp8: e4m3's format error, ~2-5e-2 on these encoders)."""
    out = tmp_path / "serving_whisper.json"
    r = _run("benchmarks/e2e_serving.py", "--device", "cpu", "--model", "examples.whisper:build_model",
             "--model-args", "size=tiny,num_layers=1", "--variants", "fp16-oasr,int8-ln,fp8", "--requests", "2",
             "--batches", "1,2", "--max-s", "2.5", "--calib", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the fixed window: 3000 frames" in r.stdout
    res = json.loads(out.read_text())
    assert set(res["graphs"]) == {"fp16-oasr", "int8-ln", "fp8"}
    assert all(len(v) == 2 for v in res["rel_err"].values())
    assert res["worst_rel_err"]["fp16-oasr"] < 1e-2 and res["worst_rel_err"]["int8-ln"] < 2e-2
    assert res["worst_rel_err"]["fp8"] < 6e-2


@pytest.mark.slow
def test_e2e_int8_fused_cpu_smoke_of_the_in_graph_variants(tmp_path):
    """benchmarks/e2e_int8_fused.py --with-options (the device step e2e-*-int8-opt) on a one-layer stock encoder:
    each in-graph variant compiles, gets the fusion its layer choice allows and stays near fp32."""
    out = tmp_path / "opt.json"
    r = _run("benchmarks/e2e_int8_fused.py", "--device", "cpu", "--model", "benchmarks.stock_transformer:build_model",
             "--model-args", "d=64,heads=4,ffn=256,layers=1", "--inputs", "benchmarks.stock_transformer:example_inputs",
             "--input-args", "batch=2,frames=20,d=64", "--calib-batches", "2", "--with-options",
             "--with-freezing", "--only", "int8-opt-all,int8-opt-fusable,int8-opt-fusable-cal,int8-opt-fusable-cal-frz",
             "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    fusion = res["fusion"]
    assert set(fusion) == {"int8-opt-all", "int8-opt-fusable", "int8-opt-fusable-cal", "int8-opt-fusable-cal-frz"}
    # every variant: the LayerNorms before the packed in-projection and fc1 become layer_norm_quant
    assert all(f["layer_norm_quant"] == 2 for f in fusion.values()), fusion
    # "all": out_proj and fc2 quantized too, each by a separate per-token pass (no producer to fuse into)
    assert fusion["int8-opt-all"]["act_quant"] == 0 and len(fusion["int8-opt-all"]["unfused"]) == 2, fusion
    # "fusable": fc2 only once calibrated (fc1's epilogue then quantizes GELU's output with the static scale)
    assert fusion["int8-opt-fusable"]["act_quant"] == 0 and not fusion["int8-opt-fusable"]["unfused"], fusion
    assert fusion["int8-opt-fusable-cal"]["act_quant"] == 1 and not fusion["int8-opt-fusable-cal"]["unfused"], fusion
    assert fusion["int8-opt-fusable-cal-frz"] == fusion["int8-opt-fusable-cal"], fusion
    # every variant still runs its own graph after the others compiled: Dynamo reused one variant's cache entry for
    # another whose backend compared equal (-opt-fusable-cal-frz ran -opt-fusable's graph, session 32)
    assert all(v["same"] for v in res["same_graph_after_timing"].values()), res["same_graph_after_timing"]
    assert set(res["accuracy"]) == {"fp16", *fusion}
    assert all(acc["rel_err_vs_fp32"] < 3e-2 for acc in res["accuracy"].values()), res["accuracy"]


def _lib_with_fatbin(tmp_path: Path, name: str, blob: bytes | None) -> Path:
    """A copy of a small ELF file with `blob` as its .nv_fatbin section (None: without one)."""
    import shutil

    out = tmp_path / name
    shutil.copy("/bin/true", out)
    if blob is not None:
        src = tmp_path / f"{name}.blob"
        src.write_bytes(blob)
        subprocess.run(["objcopy", "--add-section", f".nv_fatbin={src}", str(out)], check=True)
    return out


@pytest.mark.skipif(not (Path("/bin/true").exists() and __import__("shutil").which("objcopy")),
                    reason="needs objcopy and an ELF /bin/true")
def test_same_device_code_normalises_only_the_translation_unit_hash(tmp_path):
    """scripts/same_device_code.py (the evidence behind re-stamping a DB file, docs/tuning.md) calls libraries
    the same when their fatbins differ only in nvcc's per-TU hash, in every place it occurs, and different
    for any other byte or size; bad input is exit 2, not a traceback."""
    def code(h: bytes, body: bytes = b"\x01\x02SASS") -> bytes:
        return b"ELF" + body + b"_ZN80_INTERNAL_" + h + b"_49_kern\x00_GLOBAL__N__" + h + b"_49_x\x00" + body

    old = _lib_with_fatbin(tmp_path, "old.so", code(b"3d175439"))
    new = _lib_with_fatbin(tmp_path, "new.so", code(b"2daff705"))
    changed = _lib_with_fatbin(tmp_path, "changed.so", code(b"2daff705", b"\x01\x03SASS"))
    longer = _lib_with_fatbin(tmp_path, "longer.so", code(b"2daff705", b"\x01\x02SASS!"))
    bare = _lib_with_fatbin(tmp_path, "bare.so", None)
    tool = "scripts/same_device_code.py"
    r = _run(tool, str(old), str(new))
    assert r.returncode == 0 and r.stdout.startswith("SAME"), (r.stdout, r.stderr)
    r = _run(tool, str(old), str(new), str(old), str(changed))
    assert r.returncode == 1 and "DIFFERENT" in r.stdout and "bytes differ" in r.stdout, r.stdout
    r = _run(tool, str(old), str(longer))
    assert r.returncode == 1 and "sizes differ" in r.stdout, r.stdout
    for argv in ([str(old), str(bare)], [str(old), str(tmp_path / "missing.so")], [str(old)]):
        r = _run(tool, *argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (argv, r.stderr)
