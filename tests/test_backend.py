"""torch.compile(backend="oasr"): the rewrite pass, baked configs, dynamic M, reload, caches, prewarm/strict.

Real torch.compile graphs on the CPU (the op runs its reference path), a real user-tier DB in tmp_path.
What runs is observed through the pass's own log (`rewrite_log`), the generated code, and a GemmRecorder
(TorchDispatchMode) around the compiled graph's calls.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oasr_ops
from oasr_ops import paths
from oasr_ops.runtime import plans as library
from oasr_ops.inductor import rewrite
from oasr_ops.inductor.backend import _config_patches, oasr_backend
from oasr_ops.inductor.capture import GemmRecorder
from oasr_ops.tune import database

A, B, C = "t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop", "t64x128x64_c1x1_pp"
DEFAULT = "t128x128x64_c2x1_coop"  # the sm90 lane default


@pytest.fixture
def db_env(tmp_path, monkeypatch):
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(tmp_path / "user"))
    monkeypatch.setenv("OASR_ARCH", "sm90")
    for v in ("OASR_GEMM_HEURISTIC", "OASR_TUNE_MODEL_FALLBACK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(paths, "system_db_dir", lambda: tmp_path / "system")  # a test sees only its own DB
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # and compiles afresh
    oasr_ops.reload_tuning()
    rewrite.clear_rewrite_log()
    yield tmp_path
    monkeypatch.undo()
    oasr_ops.reload_tuning()


def publish(entries, fresh=False):
    database.publish("gemm", {sig: {"regions": regions} for sig, regions in entries.items()}, tier="user",
                     arch="sm90", fresh=fresh)


class MLP(nn.Module):
    """Linear -> GELU -> Linear (bias-free) on (B, T, 64): two GEMM sites, one with a fused activation."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))) + 1.0


def mlp(dtype=torch.bfloat16):
    torch.manual_seed(0)
    return MLP().to(dtype).eval()


def spy_backend(recorder):
    """The real oasr backend; the compiled graph's calls run under `recorder` (to see the baked configs run)."""

    def backend(gm, example_inputs, **kw):
        fn = oasr_backend(gm, example_inputs, **kw)
        boxed = getattr(fn, "_boxed_call", False)

        def run(*args):
            with recorder:
                return fn(*args)
        run._boxed_call = boxed
        return run
    return backend


def sites_of_last_graph():
    log = rewrite.rewrite_log()
    assert log, "the pass did not run"
    return log[-1].sites


# ---------------------------------------------------------------------------------------------------- backend

def test_mode_and_options_map_like_inductor():
    p = _config_patches("reduce-overhead", {"max_autotune": False})
    assert p["triton.cudagraphs"] is True and p["max_autotune"] is False
    assert isinstance(p["post_grad_custom_pre_pass"], rewrite.OasrRewritePass)
    assert "triton.cudagraphs" not in _config_patches(None, {})
    assert callable(oasr_backend.reset)
    oasr_backend.reset()


def test_entry_point_registered():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    hits = [e for e in eps if e.name == "oasr"]
    if not hits:
        pytest.skip("oasr_ops is not pip-installed here (pip install -e .)")
    assert hits[0].value == "oasr_ops.inductor.backend:oasr_backend"


@pytest.mark.slow
def test_backend_by_name_without_importing_oasr_ops(tmp_path):
    if not [e for e in importlib.metadata.entry_points(group="torch_dynamo_backends") if e.name == "oasr"]:
        pytest.skip("oasr_ops is not pip-installed here (pip install -e .)")
    code = textwrap.dedent("""
        import sys, torch
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).to(torch.bfloat16).eval()
        x = torch.randn(4, 32, dtype=torch.bfloat16)
        assert "oasr_ops" not in sys.modules
        with torch.no_grad():
            y = torch.compile(m, backend="oasr")(x)
        from oasr_ops.inductor.rewrite import rewrite_log
        (site,) = rewrite_log()[-1].sites
        assert site.activation == "relu" and site.m == 4, site
        assert (y.float() - m(x).float()).abs().max() < 0.05
        print("OK")
    """)
    env = {**os.environ, "OASR_TUNE_USER_DB": "off", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def test_conformer_compiled_matches_eager_and_bakes_db(db_env):
    from examples.conformer import build_model, example_inputs

    publish({"gemm|op=gemm_activation|dt=half|N=1024|K=256": [[64, A]],           # FFN fc1 + SiLU: M=30
             "gemm|op=gemm|dt=half|N=768|K=256": [[16, B], [None, C]],             # qkv: M=30 -> C
             "gemm|op=gemm|dt=bf16|N=256|K=1024": [[8, B]]})                       # fc2: above 8 -> fallback
    oasr_ops.reload_tuning()
    model = build_model("S", dtype="bf16", num_layers=1)
    (x,) = example_inputs(batch=2, frames=64, dtype="bf16")   # T' = 15, M = 30
    with torch.no_grad():
        ref = model(x)
        from torch._inductor.utils import run_and_get_code

        out, code = run_and_get_code(torch.compile(model, backend="oasr"), x)
    assert (out.float() - ref.float()).abs().max().item() < 0.1
    src = "\n".join(code)
    assert "torch.ops.oasr.gemm.default" in src
    all_sites = sites_of_last_graph()
    # The convolution module's depthwise nn.Conv1d is a conv1d-family site (the family's rewrite handler); no
    # entry covers it: the lane default (conv1d is not `modelled`).
    (dw,) = [s for s in all_sites if s.family == "conv1d"]
    assert (dw.op, dw.n, dw.k, dw.m, dw.tier) == ("conv1d_btc", 256, 31, 30, "default")
    sites = [s for s in all_sites if s.family == "gemm"]
    # subsampling Linear + 8 Linears per block, + the dw conv, + the frontend's two conv2d_activation sites
    assert len(sites) == 9 and len(all_sites) == 12
    c2d = [(s.op, s.n, s.k, s.config) for s in all_sites if s.family == "conv2d_activation"]
    assert c2d == [("conv2d_k3s2", 256, 9, "heuristic"), ("conv2d_k3s2", 256, 2304, "heuristic")]
    by = {}
    for s in sites:
        by.setdefault((s.op, s.n, s.k), []).append(s)
    fc1s = by[("gemm_activation", 1024, 256)]  # macaron: two FFNs per block
    assert [(s.activation, s.m, s.config, s.tier) for s in fc1s] == [("silu", 30, A, "user")] * 2
    (qkv,) = by[("gemm", 768, 256)]
    assert (qkv.config, qkv.tier) == (C, "user")
    # Intended (runtime/model_tier.py): an uncovered shape of a `modelled` family is answered by the built-in
    # cost-model tier, which gives cuBLAS at this small M (predicted time below its floor); a `torch` site keeps
    # its aten node. Before the tier these were (DEFAULT, "default").
    fc2s = by[("gemm", 256, 1024)]
    assert [(s.config, s.tier) for s in fc2s] == [("torch", "model")] * 2
    assert all(s.node.endswith("(kept on aten)") for s in fc2s)
    assert f"'{A}'" in src and f"'{C}'" in src  # the configs are in the compiled code itself
    report = oasr_ops.tuning_report(print_=False)
    lines = {ln.split(":")[0]: ln for ln in report.splitlines() if ln.startswith(("gemm:", "conv1d:"))}
    assert lines["gemm"].startswith("gemm: 9 op(s) over 6 signature(s)")
    assert "3 with a tuning entry (user=3), 6 on a fallback (model=6)" in lines["gemm"]
    assert lines["conv1d"].startswith("conv1d: 1 op(s) over 1 signature(s)")
    assert "1 on a fallback (default=1)" in lines["conv1d"]


def test_stays_on_aten_when_kernels_cannot_serve(db_env):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 60)    # N not a multiple of 8
            self.b = nn.Linear(60, 64)    # K not a multiple of 8

        def forward(self, x, w):
            return self.b(self.a(x)) + x @ w  # x @ w: the weight is an input but not transposed

    from oasr_ops.tune.census import trace_sites

    m = Odd().to(torch.bfloat16)
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)
    params = dict(m.named_parameters())
    fn = lambda *a: torch.func.functional_call(m, dict(zip(params, a[:-2])), a[-2:])  # noqa: E731
    res, _, _ = trace_sites(fn, [*params.values(), x, w])
    assert not res.sites and len(res.skipped) == 3
    res32, _, _ = trace_sites(fn, [*(p.float() for p in params.values()), x.float(), w.float()])
    assert not res32.sites and any("dtype" in why for _, why in res32.skipped)


def test_an_fp32_model_under_autocast_is_served_by_oasr_gemm(db_env):
    """Under torch.autocast an fp32 model's GEMMs read autocast's bf16 / fp16 cast of each weight, not the
    parameter: they all stayed on aten ("weight is not a transposed contiguous 2-D parameter"), so such a model got
    nothing from the backend. The cast weight is served like a parameter now (GELU fused); values and gradients
    follow eager autocast."""
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        ref = model.double()(x.double()).float()
        model.float()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        got = torch.compile(model, backend=oasr_backend)(x)
    sites = sites_of_last_graph()
    assert sorted((s.op, s.n, s.k, s.activation) for s in sites) == [
        ("gemm", 64, 128, "none"), ("gemm_activation", 128, 64, "gelu")]
    assert got.dtype == want.dtype == torch.bfloat16
    err_eager, err = (float((y.float() - ref).abs().max() / ref.abs().max()) for y in (want, got))
    assert err < max(2 * err_eager, 1e-2), (err, err_eager)
    # training under autocast: fp32 parameter gradients through the cast
    torch._dynamo.reset()
    rewrite.clear_rewrite_log()
    xg = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(xg).float().square().mean().backward()
    want_grads = [p.grad.clone() for p in model.parameters()] + [xg.grad.clone()]
    model.zero_grad()
    xg.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.compile(model, backend=oasr_backend)(xg).float().square().mean().backward()
    assert [s.family for r in rewrite.rewrite_log() for s in r.sites].count("gemm") == 2  # the forward graph's
    for g, w in zip([p.grad for p in model.parameters()] + [xg.grad], want_grads):
        assert g.dtype == w.dtype and float((g - w).norm() / w.norm()) < 2e-2


def test_a_conformer_under_autocast_gets_every_family_rewrite(db_env):
    """The conv module's depthwise and pointwise convs and the conv2d frontend required a parameter weight too and
    stayed on aten under autocast; every site is rewritten now, with the fp16 model's errors."""
    from examples.conformer import build_model, example_inputs

    model = build_model(size="S", dtype=torch.float32, device="cpu", seed=0, conv_impl="conv1d", num_layers=1).eval()
    x = example_inputs(batch=2, frames=200, dtype=torch.float32, device="cpu", seed=1)[0]
    with torch.no_grad():
        ref = model.double()(x.double()).float()
        model.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = model(x).float()
            got = torch.compile(model, backend=oasr_backend)(x).float()
    log = rewrite.rewrite_log()[-1]
    assert {s.family for s in log.sites} == {"gemm", "conv1d", "conv2d_activation"}
    assert not [why for _, why in log.skipped if "parameter" in why], log.skipped
    err_eager, err = (float((y - ref).abs().max() / ref.abs().max()) for y in (want, got))
    assert err < max(2 * err_eager, 2e-2), (err, err_eager)


def test_a_layer_on_pytorch_s_fused_fast_path_is_named_once(db_env, monkeypatch):
    """nn.TransformerEncoderLayer in eval under no_grad is one native op in the graph
    (`_transformer_encoder_layer_fwd`): no site to rewrite. That was silent; now one warning names it. With
    in-graph quantization the op is spelt out (inductor/decompose_attention.py): its four Linears are quantized,
    no warning."""
    import warnings

    from oasr_ops.inductor import backend

    monkeypatch.setattr(backend, "_warn_once", library.WarnOnce())
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).to(torch.bfloat16).eval()
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    with torch.no_grad(), warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.compile(layer, backend=oasr_backend, options={"quantization": oasr_ops.Int8W8A8Config(layers="all")})(x)
        assert len([s for s in sites_of_last_graph() if s.family == "scaled_mm"]) == 4
        assert not [w for w in got if "fast path" in str(w.message)]
        torch._dynamo.reset()
        torch.compile(layer, backend=oasr_backend)(x)
    msgs = [str(w.message) for w in got if "fast path" in str(w.message)]
    assert len(msgs) == 1 and "nn.TransformerEncoderLayer" in msgs[0] and "set_fastpath_enabled(False)" in msgs[0]
    assert not sites_of_last_graph()
    torch._dynamo.reset()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.compile(layer, backend=oasr_backend)(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert len(sites_of_last_graph()) == 4  # in-projection, out-projection, the two FFN Linears


def test_dynamic_compiles_once_and_serves_region_per_m(db_env):
    publish({"gemm|op=gemm_activation|dt=half|N=128|K=64": [[32, A], [128, B], [None, C]]})
    oasr_ops.reload_tuning()
    model = mlp()
    rec = GemmRecorder()
    compiled = torch.compile(model, backend=spy_backend(rec), dynamic=True)
    sizes = [(2, 8), (4, 16), (8, 40), (3, 5), (5, 7)]
    with torch.no_grad():
        for b, t in sizes:
            x = torch.randn(b, t, 64, dtype=torch.bfloat16)
            assert (compiled(x).float() - model(x).float()).abs().max().item() < 0.1
    log = rewrite.rewrite_log()
    assert len(log) == 1, "dynamic=True must compile one graph for every size"
    fc1 = next(s for s in log[0].sites if s.op == "gemm_activation")
    assert fc1.m is None and fc1.config.startswith("regions:") and fc1.activation == "gelu"
    assert library.parse_table(fc1.config) == ((32, A), (128, B), (None, C))
    served = {(m, library.resolve_table(cfg, m)) for sig, m, cfg in rec.configs if "N=128|K=64" in sig}
    assert served == {(16, A), (64, B), (320, C), (15, A), (35, B)}
    fc2 = next(s for s in log[0].sites if s.op == "gemm")
    # No entry: the table is the fallback's. Intended (runtime/model_tier.py, select.region_table): gemm is
    # `modelled`, so the cost-model tier answers, on its M rungs, and the baked table is that step function (it
    # was f"regions:*={DEFAULT}", the lane default, before the tier). It must agree with select_config at every M.
    from oasr_ops.runtime import select

    assert fc2.m is None
    assert fc2.config == library.format_table(select.region_table("gemm", "gemm", "bf16", 64, 128))
    assert len(library.parse_table(fc2.config)) > 1  # M-dependent: not a constant fallback
    for m in [1, 16, 35, 320, 1000, 131072, 131073, 10**6, 2**24, 2**24 + 1]:
        assert library.resolve_table(fc2.config, m) == select.select_config("gemm", "gemm", "bf16", 64, 128, m).config
    served2 = {(m, library.resolve_table(cfg, m)) for sig, m, cfg in rec.configs if "N=64|K=128" in sig}
    assert served2 == {(m, select.select_config("gemm", "gemm", "bf16", 64, 128, m).config)
                       for m in (16, 64, 320, 15, 35)}


def test_reload_changes_what_runs_and_cache_hits_only_on_unchanged_db(db_env, tmp_path, monkeypatch):
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    sig = "gemm|op=gemm_activation|dt=half|N=128|K=64"
    publish({sig: [[64, A]]})
    oasr_ops.reload_tuning()
    model = mlp()
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)  # M = 16
    rec = GemmRecorder()
    counters.clear()

    def run():
        with torch.no_grad():
            return torch.compile(model, backend=spy_backend(rec))(x)

    def ran():
        cfgs = {cfg for s, m, cfg in rec.configs if s == sig}
        rec.configs.clear()
        return cfgs

    with inductor_config.patch(fx_graph_cache=True):
        run()
        assert counters["inductor"]["fxgraph_cache_miss"] == 1 and ran() == {A}
        assert len(rewrite.rewrite_log()) == 1
        torch.compiler.reset()
        run()  # unchanged DB: the FX graph cache hits, the pass does not run, the baked config still serves
        assert counters["inductor"]["fxgraph_cache_hit"] == 1 and ran() == {A}
        assert len(rewrite.rewrite_log()) == 1
        publish({sig: [[64, B]]})
        run()  # published but not reloaded: this epoch still serves A (no recompile either)
        assert ran() == {A}
        oasr_ops.reload_tuning()
        run()  # new DB epoch + reset: recompiles, the DB hash is in the pass uuid -> cache miss, B runs
        assert counters["inductor"]["fxgraph_cache_miss"] == 2 and ran() == {B}
        assert rewrite.rewrite_log()[-1].sites[0].config == B


# ---------------------------------------------------------------------------------------------------- report

def _site_keys(results):
    return sorted((s.signature, s.m, s.config, s.tier, s.activation, s.bias) for r in results for s in r.sites)


def test_report_is_true_on_fx_cache_hit(db_env):
    """Issue 12: on a warm Inductor cache the pass does not run; the report still lists the graph's sites,
    re-derived from the cached graph, and says that is where the line comes from."""
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    from oasr_ops.tuning import family_lines

    publish({"gemm|op=gemm_activation|dt=half|N=128|K=64": [[64, A]]})
    oasr_ops.reload_tuning()
    model = mlp()
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)  # M = 16
    counters.clear()
    with inductor_config.patch(fx_graph_cache=True), torch.no_grad():
        torch.compile(model, backend=oasr_backend)(x)
        assert counters["inductor"]["fxgraph_cache_miss"] == 1
        first = family_lines()
        baked = _site_keys(rewrite.rewrite_log())
        # fc2 has no entry: the built-in cost-model tier answers it (gemm is `modelled`; intended, it was
        # "default=1" before the tier)
        assert first == ["gemm: 2 op(s) over 2 signature(s) in compiled graphs: 1 with a tuning entry (user=1), "
                         "1 on a fallback (model=1) [rewritten in this process: 1 graph(s)]"]
        rewrite.clear_rewrite_log()
        torch._dynamo.reset()
        assert family_lines()[0].startswith("no oasr op")  # nothing compiled since the log was cleared
        y = torch.compile(model, backend=oasr_backend)(x)
        assert counters["inductor"]["fxgraph_cache_hit"] == 1 and not rewrite.rewrite_log()
        (hit,) = rewrite.cache_hit_log()
        assert hit.source == "cache" and _site_keys([hit]) == baked  # what the pass baked: A for fc1 at M=16
        assert family_lines() == [first[0].replace("rewritten in this process: 1 graph(s)",
                                                   "FX/AOT cache hit: re-derived from 1 cached graph(s)")]
    assert (y.float() - model(x).float()).abs().max().item() < 0.1
    oasr_ops.reload_tuning()  # a new DB epoch: the cache hit no longer describes what will run
    assert not rewrite.cache_hit_log()


def test_cache_hit_report_of_a_conformer_matches_what_the_pass_did(db_env):
    """The re-derivation traced the cached graph with parameters that did not require grad: matmul then kept the
    conv module's pointwise Linear on a transposed input as a bmm (skipped: "a is not K-contiguous"), while the
    compile folds it into an mm, a GEMM site, so every cache hit's report lost a site. It replays Inductor's own
    pipeline on inputs like the compile's now: the same sites and the same skips."""
    from torch._inductor import config as inductor_config

    from examples.conformer import build_model, example_inputs

    model = build_model(size="S", dtype=torch.bfloat16, device="cpu", seed=0, num_layers=1, attention="rel_pos")
    x = example_inputs(batch=2, frames=200, dtype=torch.bfloat16, device="cpu", seed=1)[0]
    with inductor_config.patch(fx_graph_cache=True), torch.no_grad():
        torch.compile(model, backend=oasr_backend)(x)
        (done,) = rewrite.rewrite_log()
        rewrite.clear_rewrite_log()
        torch._dynamo.reset()
        torch.compile(model, backend=oasr_backend)(x)
        assert not rewrite.rewrite_log()
        (hit,) = rewrite.cache_hit_log()
    assert _site_keys([hit]) == _site_keys([done]) and len(done.sites) >= 10
    assert hit.skipped == done.skipped
    # the report says which sites stayed on aten, and why (the rel-pos score bmms at T' = 49 are unaligned)
    from oasr_ops.tuning import family_lines

    left = [line for line in family_lines() if line.startswith("left on aten")]
    assert left == ["left on aten: 3 site(s): bmm N=49 K=64 not multiples of 8 (1); bmm N=64 K=49 not multiples of 8 "
                    "(1); bmm N=97 K=64 not multiples of 8 (1) [FX/AOT cache hit]"]


def test_report_lists_served_plans_per_family(db_env, monkeypatch):
    """The served source: each family's `served` handler (CUDA plans with tier and call count), faked here."""
    from oasr_ops.runtime import registry
    from oasr_ops.runtime.plans import Plan
    from oasr_ops.tuning import family_lines

    sig = "gemm|op=gemm|dt=half|N=64|K=128"
    plans = [Plan(A, "user", sig, run=None, calls=5), Plan(B, "explicit", sig, run=None, calls=3),
             Plan("torch", "default", "gemm|op=gemm|dt=half|N=128|K=64", run=None, calls=2)]
    monkeypatch.setitem(registry.get("gemm").handlers, "served", lambda: plans)
    assert family_lines() == [
        "gemm: 10 call(s) served by 3 plan(s) over 2 signature(s): 5 from a tuning entry (user=5), 3 on a config "
        "the graph named (explicit=3), 2 on a fallback (default=2) [served calls since the last reload]"]


# ---------------------------------------------------------------------------------------------------- prewarm

def test_prewarm_on_cpu_reports_and_strict_raises(db_env):
    model = mlp()
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    publish({"gemm|op=gemm_activation|dt=half|N=128|K=64": [[64, A]]})
    oasr_ops.reload_tuning()
    rep = oasr_ops.prewarm(model, (x,), oasr_ops.TuningConfig(mode="prewarm", budget_s=5))
    assert len(rep.points) == 2 and len(rep.covered) == 1 and not rep.measured
    assert "no GPU" in rep.note and [p.signature for p in rep.uncovered] == ["gemm|op=gemm|dt=half|N=64|K=128"]
    with pytest.raises(oasr_ops.UncoveredPointsError, match=r"gemm\|op=gemm\|dt=half\|N=64\|K=128 M=16") as ei:
        oasr_ops.prewarm(model, (x,), oasr_ops.TuningConfig(strict=True))
    assert len(ei.value.points) == 1
    # The backend runs the same check before compiling.
    with pytest.raises(Exception, match="must-tune"):
        with torch.no_grad():
            torch.compile(model, backend=oasr_backend,
                          options={"tuning": oasr_ops.TuningConfig(strict=True)})(x)
    publish({"gemm|op=gemm|dt=half|N=64|K=128": [[None, B]]})
    oasr_ops.reload_tuning()
    assert not oasr_ops.prewarm(model, (x,), oasr_ops.TuningConfig(strict=True)).uncovered


def test_tuning_config_validates():
    with pytest.raises(ValueError):
        oasr_ops.TuningConfig(mode="later")
    assert oasr_ops.TuningConfig().mode == "off"


def test_mode_may_be_given_inside_options(monkeypatch):
    """torch.compile refuses mode= together with options=; the backend reads the mode from its options."""
    import torch._inductor.compile_fx as cfx

    from oasr_ops.inductor import backend as be

    seen = {}

    def fake_compile_fx(gm, example_inputs, config_patches=None):
        seen.update(config_patches or {})
        return gm

    monkeypatch.setattr(cfx, "compile_fx", fake_compile_fx)
    gm = torch.fx.symbolic_trace(torch.nn.Linear(8, 8))
    be.oasr_backend(gm, [torch.randn(2, 8)], options={"mode": "reduce-overhead"})
    assert seen.get("triton.cudagraphs") is True and "mode" not in seen
    seen.clear()
    be.oasr_backend(gm, [torch.randn(2, 8)], options={"max_autotune": False})
    assert "triton.cudagraphs" not in seen and seen["max_autotune"] is False
    with pytest.raises(RuntimeError, match="mode or options"):
        torch.compile(torch.nn.Linear(8, 8), backend=be.oasr_backend, mode="reduce-overhead",
                      options={"max_autotune": False})


def test_one_warning_without_cuda_graphs_on_cuda(monkeypatch):
    """A CUDA graph compiled without CUDA graphs warns once per process (host time per oasr op: docs/perf/e2e.md);
    with mode="reduce-overhead", or on CPU inputs, it does not."""
    import warnings

    import torch._inductor.compile_fx as cfx

    from oasr_ops.inductor import backend as be
    from oasr_ops.runtime.plans import WarnOnce

    monkeypatch.setattr(cfx, "compile_fx", lambda gm, example_inputs, config_patches=None: gm)
    monkeypatch.setattr(be, "_warn_once", WarnOnce())
    gm = torch.fx.symbolic_trace(torch.nn.Linear(8, 8))
    x = [torch.randn(2, 8)]

    def warned(**kw) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            be.oasr_backend(gm, x, **kw)
        return [str(w.message) for w in seen if "without CUDA graphs" in str(w.message)]

    from oasr_ops.families import hot_path

    asked: list[str] = []
    monkeypatch.setattr(hot_path, "enable", lambda backend="CUDA": asked.append(backend))
    assert warned() == []  # CPU inputs: nothing to say
    monkeypatch.setattr(be, "_any_cuda", lambda inputs: True)
    assert warned(options={"mode": "reduce-overhead"}) == [] and asked == []  # CUDA graphs: no host path to speed
    first = warned()
    assert len(first) == 1 and "reduce-overhead" in first[0] and "run on the C++ hot path" in first[0]
    assert "freezing = True" in first[0]  # not frozen: the warning names what folds the per-call weight work
    assert asked == ["CUDA"]  # the served ops switched to the C++ hot path
    assert warned() == [] and warned(options={"max_autotune": False}) == []  # once per process
    assert asked == ["CUDA"] * 3


def test_without_cuda_graphs_hot_path_off_or_unavailable(monkeypatch):
    """`cpp_hot_path=False` keeps the Python op; a hot path that cannot be built is a warning naming why, never an
    error (the Python op serves)."""
    import warnings

    import torch._inductor.compile_fx as cfx

    from oasr_ops.codegen.cache_trust import BuildError
    from oasr_ops.families import hot_path
    from oasr_ops.inductor import backend as be
    from oasr_ops.runtime.plans import WarnOnce

    monkeypatch.setattr(cfx, "compile_fx", lambda gm, example_inputs, config_patches=None: gm)
    monkeypatch.setattr(be, "_any_cuda", lambda inputs: True)
    gm = torch.fx.symbolic_trace(torch.nn.Linear(8, 8))
    asked: list[str] = []

    def warned(**kw) -> list[str]:
        monkeypatch.setattr(be, "_warn_once", WarnOnce())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            be.oasr_backend(gm, [torch.randn(2, 8)], **kw)
        return [str(w.message) for w in seen if "without CUDA graphs" in str(w.message)]

    monkeypatch.setattr(hot_path, "enable", lambda backend="CUDA": asked.append(backend))
    (msg,) = warned(options={"cpp_hot_path": False})
    assert asked == [] and "cpp_hot_path=False" in msg

    def fail(backend="CUDA"):
        raise BuildError("no C++ compiler (set CXX or put c++/g++ on PATH)")
    monkeypatch.setattr(hot_path, "enable", fail)
    (msg,) = warned()
    assert "unavailable" in msg and "no C++ compiler" in msg

    # on already (the user's `enable_cpp_hot_path(ops=...)`): the backend keeps that choice, asks nothing
    monkeypatch.setattr(hot_path, "enabled", lambda: "CUDA")
    (msg,) = warned()
    assert "run on the C++ hot path" in msg
    # frozen already: the warning does not suggest freezing
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        (msg,) = warned()
    assert "freezing" not in msg


def test_freezing_option_warns_and_global_freezing_folds(monkeypatch):
    """options={"freezing": True} cannot freeze (Dynamo decides at trace time, from the global config): one warning
    saying so, the same result; the global config freezes through backend="oasr" (parameters become constants)."""
    import warnings

    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from oasr_ops.inductor import backend as be
    from oasr_ops.runtime.plans import WarnOnce

    monkeypatch.setattr(be, "_warn_once", WarnOnce())
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = m(x)

    def compiled(**kw) -> tuple[torch.Tensor, str, list[str]]:
        torch.compiler.reset()
        with warnings.catch_warnings(record=True) as seen, torch.no_grad():
            warnings.simplefilter("always")
            out, code = run_and_get_code(torch.compile(m, backend=be.oasr_backend, **kw), x)
        return out, "\n".join(code), [str(w.message) for w in seen if "freezing" in str(w.message)]

    out, code, said = compiled(options={"freezing": True})
    assert len(said) == 1 and "torch._inductor.config.freezing = True" in said[0]
    assert "_frozen_param" not in code
    torch.testing.assert_close(out, ref)
    with inductor_config.patch(freezing=True):  # (monkeypatch would delete the config entry when it undoes)
        out, code, said = compiled()
    assert said == [] and "_frozen_param" in code
    torch.testing.assert_close(out, ref)
    torch.compiler.reset()
    assert inductor_config.freezing is False  # restored for the tests after this one
