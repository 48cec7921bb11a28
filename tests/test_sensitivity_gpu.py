"""oasr_ops.quantization_sensitivity / error_budget_filter on the GPU: an fp16 model on the real int8 / fp8 kernels
against its fp32 twin's outputs. Checked: each layer's error equals that of `quantize_` on the same layer alone
(the tool's swapping runs the same kernels as the public path), the budget's measured error is what quantize_
with its filter gives, and the model comes back unchanged. Run: ``pytest -m gpu tests/test_sensitivity_gpu.py``.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.sensitivity import max_relative_error  # noqa: E402


class FFNStack(nn.Module):
    def __init__(self, d: int = 256, blocks: int = 3) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.fc1 = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(blocks))

    def forward(self, x):
        for ln, f1, f2 in zip(self.norms, self.fc1, self.fc2):
            x = x + f2(nn.functional.gelu(f1(ln(x))))
        return x


@pytest.mark.parametrize("config", ["int8_w8a8", "fp8_w8a8"])
def test_sensitivity_and_budget_on_the_kernels(config):
    torch.manual_seed(0)
    ref_model = FFNStack().cuda().eval()
    model = copy.deepcopy(ref_model).half()
    batches = [torch.randn(4, 127, 256, device="cuda", dtype=torch.float16) for _ in range(2)]  # M = 508
    with torch.no_grad():
        refs = [ref_model(b.float()) for b in batches]
    modules = dict(model.named_modules())
    sens = oasr_ops.quantization_sensitivity(model, batches, config, reference=refs)
    assert len(sens.layers) == 6 and 0 < sens.baseline < 5e-3  # fp16 vs fp32

    def alone(layers):
        q = oasr_ops.quantize_(copy.deepcopy(model), config, filter_fn=lambda m, fqn: fqn in set(layers))
        with torch.no_grad():
            return max(max_relative_error(q(b), r) for b, r in zip(batches, refs))

    for fqn, err in sens.layers.items():
        assert err == alone([fqn]) and sens.baseline < err < 0.2, fqn
    budget = sorted(sens.layers.values())[3]  # room for a few layers, not for all
    plan = oasr_ops.error_budget_filter(model, batches, config, budget, reference=refs, sensitivity=sens)
    assert 1 <= len(plan.layers) <= 5 and plan.error == alone(plan.layers) <= budget
    assert all(model.get_submodule(n) is m for n, m in modules.items())
