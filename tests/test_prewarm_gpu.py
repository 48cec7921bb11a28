"""prewarm on the GPU measures uncovered gemm and scaled_mm points into the user tier (one budget), and the
backend's quantization option runs the same bits as quantize_ on CUDA."""
import copy

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops import paths
from oasr_ops.inductor.backend import oasr_backend
from oasr_ops.runtime import select

pytestmark = pytest.mark.gpu


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.fc2 = nn.Linear(512, 256, bias=False)

    def forward(self, x):
        return self.fc2(torch.nn.functional.silu(self.fc1(x)))


@pytest.fixture
def user_tier(tmp_path, monkeypatch):
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(tmp_path / "user"))
    monkeypatch.setattr(paths, "system_db_dir", lambda: tmp_path / "system")
    oasr_ops.reload_tuning()
    yield tmp_path
    monkeypatch.undo()
    oasr_ops.reload_tuning()


def test_prewarm_measures_both_families_into_the_user_tier(user_tier):
    torch.manual_seed(0)
    fp16 = Two().half().cuda().eval()
    q = oasr_ops.quantize_(copy.deepcopy(fp16), "int8_w8a8")
    x = torch.randn(4, 50, 256, dtype=torch.float16, device="cuda")
    for model, family in ((fp16, "gemm"), (q, "scaled_mm")):
        with pytest.raises(oasr_ops.UncoveredPointsError):
            oasr_ops.prewarm(model, (x,), oasr_ops.TuningConfig(mode="off", strict=True))
        rep = oasr_ops.prewarm(model, (x,), oasr_ops.TuningConfig(mode="prewarm", budget_s=60, strict=True))
        assert rep.measured and not rep.uncovered, str(rep)
        assert all(p.family == family for p in rep.points)
        for p in rep.points:
            assert select.select_config(p.family, p.op, p.dtype, p.n, p.k, p.m).tier == "user"
        assert (user_tier / "user" / "sm90" / f"{family}.json").is_file()


def test_backend_quantization_option_on_cuda(user_tier):
    torch.manual_seed(0)
    fp16 = Two().half().cuda().eval()
    q = oasr_ops.quantize_(copy.deepcopy(fp16), "int8_w8a8")
    x = torch.randn(4, 50, 256, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        want = q(x)
        ref = copy.deepcopy(fp16).float()(x.float())
        every = oasr_ops.Int8W8A8Config(layers="all")  # every qualifying layer, not the fusable ones only
        got = torch.compile(fp16, backend=oasr_backend, options={"quantization": every})(x)
    # Not bitwise: Inductor fuses the SiLU and the activation quantization (fp32 intermediates), so a few int8
    # activations round differently from the eager layer's. Both must be int8-accurate against fp32.
    rel = lambda y: ((y.float() - ref).abs().max() / ref.abs().max()).item()  # noqa: E731
    assert rel(want) < 3e-2 and rel(got) < 3e-2
    assert ((got.float() - want.float()).abs().max() / want.float().abs().max()).item() < 2e-2
