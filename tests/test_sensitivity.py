"""oasr_ops.quantization_sensitivity / error_budget_filter on the CPU (the ops' reference formulas): the layers
measured, the errors against an independent quantize_ of the same layers, the budget's measured fit, the model
left as it came, and the error paths."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import oasr_ops
from oasr_ops.sensitivity import max_relative_error


class Block(nn.Module):
    """LayerNorm -> fc1 -> GELU -> fc2 (+ residual) -> out; `odd` does not qualify (K=20), `attn` is a stock
    nn.MultiheadAttention (quantize_ converts it: its in_proj / out_proj are candidates)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.odd = nn.Linear(20, 64)
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
        self.out = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        h = x + self.fc2(torch.nn.functional.gelu(self.fc1(h)))
        h = h + self.odd(x[..., :20]) + self.attn(h, h, h, need_weights=False)[0]
        return self.out(h)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Block().eval()


def _batches(n: int = 2, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 12, 64, generator=g) for _ in range(n)]


def _independent_error(model: nn.Module, batches, config, layers, reference=None) -> float:
    """The error of quantize_(copy, config, only `layers`) — the public path, not the tool's swapping."""
    q = oasr_ops.quantize_(copy.deepcopy(model), config, filter_fn=lambda m, fqn: fqn in set(layers))
    with torch.no_grad():
        refs = reference if reference is not None else [model(b) for b in batches]
        return max(max_relative_error(q(b), r) for b, r in zip(batches, refs))


def _state(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("config", ["int8_w8a8", "fp8_w8a8"])
def test_each_layer_error_is_the_error_of_quantizing_it_alone(config):
    model, batches = _model(), _batches()
    modules_before, state_before = dict(model.named_modules()), _state(model)
    sens = oasr_ops.quantization_sensitivity(model, batches, config)
    # the qualifying linears only: odd (K=20) does not qualify; the stock attention's projections under the names
    # quantize_ gives them (it converts the module to LinearMultiheadAttention)
    assert list(sens.layers) == ["fc1", "fc2", "out", "attn.in_proj", "attn.out_proj"]
    # measured with the attention converted (fp32 SDPA on its own q/k/v: rounding apart from the stock module's)
    assert 0.0 <= sens.baseline < 1e-6
    for fqn, err in sens.layers.items():
        assert err == _independent_error(model, batches, config, [fqn]) and 0 < err < 0.2
    # the model came back as it was: the same module objects, the same weights
    assert dict(model.named_modules()).keys() == modules_before.keys()
    assert all(model.get_submodule(n) is m for n, m in modules_before.items())
    after = model.state_dict()
    assert after.keys() == state_before.keys() and all(torch.equal(after[k], v) for k, v in state_before.items())


def test_the_layer_fed_outliers_ranks_most_harmful():
    model = _model()
    with torch.no_grad():  # a few huge input channels of `out`: per-token scales crush the others
        model.fc2.bias[:3] = 300.0
    sens = oasr_ops.quantization_sensitivity(model, _batches(), "int8_w8a8")
    worst, _ = sens.ranked()[-1]
    assert worst == "out"
    assert sens.table().splitlines()[1].endswith("  out")
    assert sens.table(top=1).count("\n") == 1


def test_filter_fn_narrows_and_convs_are_int8_candidates():
    class WithConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(16, 32, 3, padding=1)
            self.fc = nn.Linear(32, 16)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))

    torch.manual_seed(0)
    m = WithConv().eval()
    xs = [torch.randn(2, 16, 8, 8)]
    assert list(oasr_ops.quantization_sensitivity(m, xs, "int8_w8a8").layers) == ["conv", "fc"]
    assert list(oasr_ops.quantization_sensitivity(m, xs, oasr_ops.Int8W8A8Config(convs=False)).layers) == ["fc"]
    assert list(oasr_ops.quantization_sensitivity(m, xs, "fp8_w8a8").layers) == ["fc"]  # fp8 has no conv
    only_conv = oasr_ops.quantization_sensitivity(m, xs, "int8_w8a8", filter_fn=lambda mod, fqn: fqn == "conv")
    assert list(only_conv.layers) == ["conv"]


@pytest.mark.parametrize("config", ["int8_w8a8", "fp8_w8a8"])
def test_budget_keeps_the_measured_prefix_within_the_error(config):
    model, batches = _model(), _batches()
    sens = oasr_ops.quantization_sensitivity(model, batches, config)
    ranked = [fqn for fqn, _ in sens.ranked()]
    everything = _independent_error(model, batches, config, ranked)
    budget = (max(sens.layers.values()) + everything) / 2 if everything > max(sens.layers.values()) else everything
    plan = oasr_ops.error_budget_filter(model, batches, config, budget, sensitivity=sens,
                                        gain=lambda module, fqn: 1.0)  # equal gains: by error alone
    assert plan.layers == tuple(ranked[:len(plan.layers)])
    # least harmful first: no layer left out did less harm on its own than one taken
    errs = [sens.layers[f] for f in ranked]
    assert errs == sorted(errs)
    assert all(sens.layers[f] <= sens.layers[g] for f in plan.layers for g in sens.layers if g not in plan.layers)
    # what it says it measured is what quantize_ with it gives
    assert plan.error == _independent_error(model, batches, config, plan.layers) <= budget
    q = oasr_ops.quantize_(copy.deepcopy(model), config, filter_fn=plan)
    kinds = (oasr_ops.QuantLinear, oasr_ops.Fp8QuantLinear)
    assert sorted(n for n, m in q.named_modules() if isinstance(m, kinds)) == sorted(plan.layers)
    # the next layer would have broken the budget (measured by the bisection, or the whole set that did not fit)
    k = len(plan.layers)
    if k < len(ranked):
        assert plan.measured[k + 1] > budget
    assert plan.summary().startswith(f"{k} of 5 candidate layer(s)")


def test_default_order_is_budget_spent_per_flop():
    """By (e_i^2 - e_0^2) / weight numel (computed here independently); gain=1 gives the error order; a gain can
    put any layer first."""
    model, batches = _model(), _batches()
    with torch.no_grad():
        refs = [_model(seed=9)(b) * 1e-3 + model(b) for b in batches]  # a reference a little off: e_0 > 0
    sens = oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8", reference=refs)
    assert 0 < sens.baseline < min(sens.layers.values())
    numel = {n: model.get_submodule(n).weight.numel() for n in sens.layers if not n.startswith("attn.")}
    numel.update({"attn.in_proj": model.attn.in_proj_weight.numel(), "attn.out_proj": model.attn.out_proj.weight.numel()})
    assert numel == {"fc1": 8192, "fc2": 8192, "out": 2048, "attn.in_proj": 12288, "attn.out_proj": 4096}
    expect = sorted(sens.layers, key=lambda n: (sens.layers[n] ** 2 - sens.baseline ** 2) / numel[n])
    plan = oasr_ops.error_budget_filter(model, batches, "int8_w8a8", 1.0, reference=refs, sensitivity=sens)
    assert plan.layers == tuple(expect)  # budget 1.0: every layer, in the order taken
    by_error = oasr_ops.error_budget_filter(model, batches, "int8_w8a8", 1.0, reference=refs, sensitivity=sens,
                                            gain=lambda m, fqn: 1.0)
    assert by_error.layers == tuple(fqn for fqn, _ in sens.ranked())
    # a gain that prefers one layer above all puts it first
    first = oasr_ops.error_budget_filter(model, batches, "int8_w8a8", 1.0, reference=refs, sensitivity=sens,
                                         gain=lambda m, fqn: 1e9 if fqn == expect[-1] else 1.0)
    assert first.layers[0] == expect[-1]


def test_budget_extremes():
    model, batches = _model(), _batches()
    sens = oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8")
    none = oasr_ops.error_budget_filter(model, batches, "int8_w8a8", min(sens.layers.values()) / 2)
    assert none.layers == () and none.error == 0.0 and not none(model.fc1, "fc1")
    every = oasr_ops.error_budget_filter(model, batches, "int8_w8a8", 1.0)
    with pytest.raises(ValueError, match=r"gain\('fc1'\) must be a positive number"):
        oasr_ops.error_budget_filter(model, batches, "int8_w8a8", 1.0, sensitivity=sens,
                                     gain=lambda m, fqn: 0.0 if fqn == "fc1" else 1.0)
    assert sorted(every.layers) == ["attn.in_proj", "attn.out_proj", "fc1", "fc2", "out"] and every(model.fc1, "fc1")
    assert every.measured.keys() == {0, 5}  # the whole set fit: no bisection


def test_reference_outputs_set_the_baseline_and_a_budget_below_it_is_refused():
    model, batches = _model(), _batches()
    other = _model(seed=5)  # a different model as "the reference": the baseline is its distance
    with torch.no_grad():
        refs = [other(b) for b in batches]
    sens = oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8", reference=refs)
    assert sens.baseline == pytest.approx(max(max_relative_error(model(b), r) for b, r in zip(batches, refs)),
                                          rel=1e-4) and sens.baseline > 0.1
    with pytest.raises(ValueError, match="unquantized model's error is already"):
        oasr_ops.error_budget_filter(model, batches, "int8_w8a8", sens.baseline / 2, reference=refs)


def test_forward_dict_batches_and_structured_outputs():
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(32, 16), nn.Linear(32, 16)

        def forward(self, x, scale=1.0):
            return {"a": self.a(x) * scale, "b": (self.b(x), torch.ones(1, dtype=torch.long))}

    torch.manual_seed(0)
    m = TwoHeads().eval()
    batches = [{"x": torch.randn(4, 32), "scale": 2.0}]
    sens = oasr_ops.quantization_sensitivity(m, batches, "int8_w8a8")
    assert set(sens.layers) == {"a", "b"} and all(v > 0 for v in sens.layers.values())
    via_forward = oasr_ops.quantization_sensitivity(m, [torch.randn(4, 32)], "int8_w8a8",
                                                    forward=lambda mod, x: mod(x, scale=2.0)["a"])
    assert via_forward.layers["b"] == 0.0 < via_forward.layers["a"]  # b does not reach this output


def test_compiled_model_is_measured_through_its_module():
    model, batches = _model(), _batches(1)
    compiled = torch.compile(model, backend="eager")
    assert oasr_ops.quantization_sensitivity(compiled, batches, "int8_w8a8") == \
        oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8")


def test_an_exception_mid_measurement_leaves_the_model_as_it_came():
    model, batches = _model(), _batches()
    before = dict(model.named_modules())
    calls = []

    def forward(m, b):
        calls.append(1)
        if len(calls) == 4:  # reference (2 batches), baseline (2), then the first quantized layer fails
            raise RuntimeError("boom")
        return m(b)

    with pytest.raises(RuntimeError, match="boom"):
        oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8", forward=forward)
    assert all(model.get_submodule(n) is m for n, m in before.items())


def test_nan_output_is_never_within_budget():
    out = torch.tensor([1.0, float("nan")])
    assert math.isnan(max_relative_error(out, torch.tensor([1.0, 2.0])))
    assert max_relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert max_relative_error(torch.ones(2), torch.zeros(2)) == math.inf


@pytest.mark.parametrize("bad, match", [
    (dict(batches=[]), "no batches"),
    (dict(reference=[torch.zeros(1)]), "reference has 1 output"),
    (dict(max_error=0.0), "positive number"),
    (dict(max_error=float("nan")), "positive number"),
    (dict(max_error="0.1"), "positive number"),
])
def test_bad_arguments_are_clear_errors(bad, match):
    args = dict(batches=_batches(), max_error=0.1)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        oasr_ops.error_budget_filter(_model(), args.pop("batches"), "int8_w8a8", **args)


def test_output_structure_mismatch_is_a_clear_error():
    m = _model()
    with pytest.raises(ValueError, match="floating tensor"):
        oasr_ops.quantization_sensitivity(m, _batches(1), "int8_w8a8", reference=[(torch.zeros(1), torch.zeros(1))])


def test_prerequisites_move_before_and_orphans_drop():
    from oasr_ops.sensitivity import _after_prerequisites

    assert _after_prerequisites(["fc2", "out", "fc1"], {"fc2": "fc1"}) == ["fc1", "fc2", "out"]
    assert _after_prerequisites(["fc2", "out"], {"fc2": "fc1"}) == ["out"]  # fc1 not a candidate: fc2 dropped
    assert _after_prerequisites(["a", "b", "c"], {"a": "b", "b": "a"}) == ["c"]  # a cycle: neither
    assert _after_prerequisites(["c", "b", "a"], {"c": "b", "b": "a"}) == ["a", "b", "c"]  # a chain


def test_fusable_filter_pairs_keep_fc2_behind_fc1():
    """fusable_filter says fc2 needs fc1 (its input is quantized in fc1's epilogue); the budget reads that from
    the filter: fc2 never comes without fc1, and not at all when fc1 is not a candidate."""
    model, batches = _model(), _batches()
    flt = oasr_ops.fusable_filter(copy.deepcopy(model), batches[0])
    torch.compiler.reset()
    assert flt.layers == {"fc1", "fc2"} and flt.requires == {"fc2": "fc1"}  # out's input is no LayerNorm's
    assert flt(model.fc1, "fc1") and not flt(model.out, "out")
    sens = oasr_ops.quantization_sensitivity(model, batches, "fp8_w8a8", filter_fn=flt)
    plan = oasr_ops.error_budget_filter(model, batches, "fp8_w8a8", 1.0, filter_fn=flt, sensitivity=sens,
                                        gain=lambda m, fqn: 1e9 if fqn == "fc2" else 1.0)  # fc2 first by gain
    assert plan.layers == ("fc1", "fc2")
    alone = oasr_ops.error_budget_filter(model, batches, "fp8_w8a8", 1.0, filter_fn=flt, sensitivity=sens,
                                         requires={})  # an explicit empty table: no pairs
    assert set(alone.layers) == {"fc1", "fc2"}
    # fc1 over the budget on its own: fc2 is not taken either, though it fits alone
    budget = (sens.layers["fc1"] + sens.layers["fc2"]) / 2
    if sens.layers["fc2"] < budget < sens.layers["fc1"]:
        assert oasr_ops.error_budget_filter(model, batches, "fp8_w8a8", budget, filter_fn=flt,
                                            sensitivity=sens).layers == ()
    no_fc1 = oasr_ops.error_budget_filter(model, batches, "fp8_w8a8", 1.0, requires=flt.requires,
                                          filter_fn=lambda m, fqn: fqn != "fc1")
    assert "fc2" not in no_fc1.layers and set(no_fc1.layers) == {"out", "attn.in_proj", "attn.out_proj"}


def test_training_mode_warns_and_bad_arguments_are_named():
    model, batches = _model(), _batches(1)
    model.train()
    with pytest.warns(UserWarning, match="training mode"):
        oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8")
    model.eval()
    with pytest.raises(ValueError, match="differ in shape"):
        oasr_ops.quantization_sensitivity(model, batches, "int8_w8a8", reference=[torch.zeros(3)])
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        oasr_ops.quantization_sensitivity(lambda x: x, batches, "int8_w8a8")
    with pytest.raises(ValueError, match="unknown scheme"):
        oasr_ops.quantization_sensitivity(model, batches, "int4")
