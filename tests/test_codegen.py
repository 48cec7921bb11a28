"""Every lane renders valid source for every config; JitSpec keys; one real nvcc build when nvcc exists."""
import ctypes
import os
import shutil
import subprocess
import sys

import pytest

from oasr_ops.codegen import jit
from oasr_ops.families.gemm.kernels import production_configs, specs_for
from oasr_ops.codegen.jit import BuildError, JitSpec, build_many
from oasr_ops.runtime.registry import LANES, get_lane
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse


@pytest.mark.parametrize("lane", [l for l in LANES.values() if l.family == "gemm"], ids=lambda l: l.name)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_every_config_renders(lane, dtype):  # the int8 lanes' rendering: tests/test_scaled_mm.py
    element = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}[dtype]
    for c in lane.space:
        src = render(lane, c, dtype)
        assert f"using ElementAB = {element};" in src
        for sym in ("oasr_run", "oasr_can_implement", "oasr_workspace_size", "oasr_describe", "oasr_abi_version"):
            assert sym in src
        m, n, k = c.kernel_key().tile
        if c.generation == "3x":
            assert f"cute::Shape<cute::_{m}, cute::_{n}, cute::_{k}>" in src
            assert "cutlass::gemm::collective::CollectiveBuilder" in src
            sched = {"cooperative": "KernelTmaWarpSpecializedCooperative", "streamk": "KernelTmaWarpSpecializedCooperative",
                     "pingpong": "KernelTmaWarpSpecializedPingpong"}[c.kernel_schedule]
            assert f"cutlass::gemm::{sched}" in src
            assert ("cutlass::gemm::StreamKScheduler" in src) == (c.kernel_schedule == "streamk")
            assert f"cute::Shape<cute::_{c.cluster[0]}, cute::_{c.cluster[1]}, cute::_1>" in src
            assert "Sm90RowBroadcast" in src and "oasr::BiasAct" in src
        else:
            assert f"cutlass::gemm::GemmShape<{m}, {n}, {k}>" in src
            wm, wn, wk = c.warp
            assert f"cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>" in src
            assert "cutlass::gemm::kernel::DefaultGemmUniversal" in src
            assert "LinearCombinationGeneric<\n    oasr::BiasAct" in src


def test_render_rejects_foreign_config():
    with pytest.raises(ValueError):
        render(get_lane("sm80_f16_mma"), parse("t64x64x64_c1x1_pp"), "fp16")
    with pytest.raises(ValueError):
        render(get_lane("sm90_f16_wgmma"), parse("t64x64x64_c1x1_pp"), "fp32")


def test_jitspec_key_stable_and_sensitive(monkeypatch, tmp_path):
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    lane = get_lane("sm90_f16_wgmma")
    a = JitSpec.for_kernel(lane, parse("t64x64x64_c1x1_pp"), "fp16")
    b = JitSpec.for_kernel(lane, parse("t64x64x64_c1x1_pp"), "fp16")
    assert a.key == b.key and len(a.key) == 20
    assert a.so_path.parent == tmp_path  # OASR_JIT_DIR honoured, no device in the key or path
    assert JitSpec.for_kernel(lane, parse("t64x64x64_c1x1_pp"), "bf16").key != a.key  # source changes
    assert JitSpec.for_kernel(lane, parse("t64x128x64_c1x1_pp"), "fp16").key != a.key
    # the same source for another target arch / another flag set / another nvcc gets another key
    sm80 = get_lane("sm80_f16_mma")
    k80 = JitSpec(sm80, parse("b64x64x64_w32x32x64_s3"), "fp16", "80")
    k90 = JitSpec(sm80, parse("b64x64x64_w32x32x64_s3"), "fp16", "90")
    assert k80.key != k90.key
    monkeypatch.setattr(jit, "nvcc_flags_for_key", lambda arch: ("-O2",))
    assert JitSpec(sm80, parse("b64x64x64_w32x32x64_s3"), "fp16", "80").key != k80.key
    monkeypatch.undo()
    monkeypatch.setattr(jit, "nvcc_version", lambda: "release 99.9")
    assert JitSpec(sm80, parse("b64x64x64_w32x32x64_s3"), "fp16", "80").key != k80.key


def test_split_k_configs_share_a_spec():
    lane = get_lane("sm80_f16_mma")
    specs = specs_for(lane, [parse("b64x64x64_w32x32x64_s3"), parse("b64x64x64_w32x32x64_s3_k2"),
                             parse("b64x64x64_w32x32x64_s3_k4")], ("fp16",))
    assert len(specs) == 1


def test_production_set(monkeypatch):
    lane = get_lane("sm90_f16_wgmma")
    prod = production_configs(lane, "sm90")
    assert prod[0] == lane.default and set(lane.coverage_basis) <= set(prod)
    monkeypatch.setenv("OASR_GEMM_COMPILE_SET", "all")
    assert production_configs(lane, "sm90") == list(lane.space)


def test_target_arch(monkeypatch):
    sm80, sm90 = get_lane("sm80_f16_mma"), get_lane("sm90_f16_wgmma")
    assert jit.target_arch(sm90, "sm90") == "90a"
    assert jit.target_arch(sm80, "sm90") == "90"  # 2.x kernels run on Hopper when built for it
    assert jit.target_arch(sm80, "sm86") == "86"
    monkeypatch.setenv("OASR_CUDA_ARCH_LIST", "9.0a")
    assert jit.target_arch(sm80) == "90"
    monkeypatch.delenv("OASR_CUDA_ARCH_LIST")
    assert jit.target_arch(sm80) == "80"


def test_build_failure_reports_log_and_import_survives(monkeypatch, tmp_path):
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = JitSpec(get_lane("sm80_f16_mma"), parse("b64x64x64_w32x32x64_s3"), "fp16", "80")
    monkeypatch.setattr(jit, "nvcc_path", lambda: "/bin/false")
    with pytest.raises(BuildError) as ei:
        spec.build()
    assert ei.value.log_path is not None and ei.value.log_path.is_file()
    assert "nvcc log:" in str(ei.value)
    report = build_many([spec], jobs=1, progress=False)
    assert spec.name in report.failed and not report.built
    # a broken toolchain never breaks the import
    r = subprocess.run([sys.executable, "-c", "import oasr_ops"], capture_output=True,
                       env={**os.environ, "PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_build_exports_c_abi(monkeypatch, tmp_path):
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = JitSpec(get_lane("sm80_f16_mma"), parse("b64x64x64_w32x32x64_s3"), "fp16", "80")
    path = spec.build()
    assert path.is_file() and path.name.endswith(f"{spec.key}.so")
    lib = ctypes.CDLL(str(path))  # loads on a CPU machine: cudart is static, no GPU touched at load
    for sym in ("oasr_run", "oasr_can_implement", "oasr_workspace_size", "oasr_describe", "oasr_abi_version"):
        assert hasattr(lib, sym)
    lib.oasr_describe.restype = ctypes.c_char_p
    assert lib.oasr_describe().decode().startswith("b64x64x64_w32x32x64_s3|fp16|sm80_f16_mma|")
    # second build reuses the installed library (file lock + re-check)
    mtime = path.stat().st_mtime_ns
    assert spec.build() == path and path.stat().st_mtime_ns == mtime
