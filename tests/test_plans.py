"""The plan skeleton every family shares (runtime.plans.make_plan), on the CPU: the config argument -> baked row ->
auto -> sentinel -> concrete id -> the family's launcher or its torch path. Launchers are stand-ins here (the real
ones need a GPU); what is checked is which config and tier each call key resolves to."""
from __future__ import annotations

import pytest

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.runtime.plans import expand_sentinel, make_plan, resolve_config_arg
from oasr_ops.runtime.registry import get_lane, native_lane
from oasr_ops.runtime.select import Selection

SM90_INT8 = get_lane("sm90_int8_wgmma")
G90 = native_lane("sm90")


def _never():
    raise AssertionError("selection must not run for a concrete or baked config")


def test_resolve_config_arg():
    assert resolve_config_arg("t64x64x64_c1x1_pp", 10, _never) == ("t64x64x64_c1x1_pp", "explicit")
    table = "regions:16=torch;256=t64x64x64_c1x1_pp;*=default"
    assert resolve_config_arg(table, 16, _never) == ("torch", "baked")
    assert resolve_config_arg(table, 17, _never) == ("t64x64x64_c1x1_pp", "baked")
    assert resolve_config_arg(table, 10**6, _never) == ("default", "baked")
    assert resolve_config_arg("auto", 5, lambda: Selection("fused", "system", "s")) == ("fused", "system")
    assert resolve_config_arg("regions:8=torch", 9, lambda: Selection("x", "user", "s")) == ("x", "user")


def test_expand_sentinel():
    from oasr_ops.families.scaled_mm.heuristic import heuristic_config

    assert expand_sentinel("gemm", "default", 1, 512, 256, "sm90") == G90.default.id
    assert expand_sentinel("gemm", "heuristic", 1, 512, 256, "sm90") == "heuristic"  # gemm has no heuristic
    assert expand_sentinel("gemm", "default", 1, 512, 256, "sm70") == "torch"  # no lane runs there
    assert expand_sentinel("bmm", "default", 1, 64, 64, "sm80") == "torch"
    for m in (1, 100, 5000):
        assert expand_sentinel("scaled_mm", "heuristic", m, 768, 256, "sm90") == heuristic_config(m, 768, 256, "sm90")
    assert expand_sentinel("scaled_mm", "fused", 1, 768, 256, "sm90") == "fused"
    assert expand_sentinel("scaled_mm", SM90_INT8.default.id, 1, 768, 256, "sm90") == SM90_INT8.default.id


@pytest.mark.parametrize("kernel_ok", (True, False))
def test_make_plan(kernel_ok):
    launched = []

    def kernel_run(cfg):
        launched.append(cfg.id)
        return (lambda *a: "kernel") if kernel_ok else None

    def plan(family, config, m, keep=False, select=_never):
        return make_plan(family, config, m, 768, 256, "sm90", "sig", select=select,
                         torch_run=lambda s: (lambda *a: f"torch:{s}"), kernel_run=kernel_run, keep_sentinel=keep)

    p = plan("scaled_mm", "regions:64=heuristic;*=torch", 10)
    assert p.tier == "baked" and launched[-1] in SM90_INT8.ids()
    assert (p.config, p.run()) == ((launched[-1], "kernel") if kernel_ok else ("torch", "torch:torch"))
    p = plan("scaled_mm", "regions:64=heuristic;*=fused", 100)
    assert (p.config, p.tier, p.run()) == ("torch", "baked", "torch:fused")
    p = plan("gemm", "fused", 10, keep=True)  # gemm keeps the sentinel's name: fused is a cuBLASLt epilogue
    assert (p.config, p.tier, p.run()) == ("fused", "explicit", "torch:fused")
    p = plan("gemm", "auto", 10, keep=True, select=lambda: Selection("default", "default", "sig"))
    assert p.tier == "default" and launched[-1] == G90.default.id
    assert p.config == (G90.default.id if kernel_ok else "torch")
