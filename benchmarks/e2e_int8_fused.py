"""int8 with the quantization fused into its producers vs fp16, end to end, on any encoder (issue 15).

  python benchmarks/e2e_int8_fused.py --model examples.conformer:build_model --model-args size=M \
      --inputs examples.conformer:example_inputs --input-args batch=16,frames=1000 --rounds 3 --out e2e_int8_fused.json

Variants (each compiles its own copy of the same fp16 weights, mode="reduce-overhead": CUDA graphs):
  fp16       backend="inductor" (the baseline the issue's goal is measured against)
  int8-fused `fusable_filter` (the layers after a LayerNorm, and fc2 after fc1 + GELU/SiLU) -> `quantize_` ->
             `calibrate` on --calib-batches fresh inputs -> backend="oasr" (fusion pass: LayerNorm ->
             oasr.layer_norm_quant, fc1 -> oasr.scaled_mm_act_quant -> fc2)
  int8-all   (--with-unfused) every qualifying layer int8, fusion pass off: the pre-issue-15 int8 path
--quantization fp8_w8a8: the same with e4m3 (`quantize_(model, "fp8_w8a8")`): fp8-fused-act (the fusable layers,
  calibrated, fuse_quantization="act": fc1 -> oasr.scaled_mm_fp8_act_quant -> fc2, the LayerNorms' e4m3
  quantization left to Inductor), fp8-fused (the same with fuse_quantization=True: the LayerNorms too, as
  oasr.layer_norm_quant(scheme="fp8")) and, with --with-unfused, fp8-all (every qualifying layer fp8, fusion pass
  off); these three leave the residual adds unfused (fuse_residual=False) and --with-residual adds fp8-fused-act-res
  and fp8-fused-res (oasr.scaled_mm_fp8_residual: fc2's epilogue adds the residual) and a -res copy of each budget
  variant. --with-act-only / --with-layout-opt / --with-siblings are int8 variants
  (--with-siblings: int8-fused-sib, the q/k/v GEMMs as one: inductor/fuse_siblings.py; --with-freezing: -res,
  -sib and -act-res compiled with Inductor's freezing, -frz, and the frozen baseline fp16-frz). --with-options
  adds the in-graph path (`options={"quantization": ...}` on the fp16 model, fuse_quantization=True) for either
  scheme: -opt-all, -opt-fusable, -opt-fusable-cal (see --help).
R rounds alternate the variants (order reversed every round); each round keeps the median of --iters calls
timed with CUDA events. Accuracy vs the same weights in fp32 (eager): max |out - ref| / max |ref|, and a
task-level proxy: a random-init CTC head (Linear(d, --vocab), seed 123, blank = 0) on every variant's output,
greedy decoding (argmax per frame, repeats collapsed, blanks dropped): frame-argmax agreement with fp32 and the
token error rate (edit distance / reference tokens). --error-budget E adds <scheme>-fused-act-budget: the fusable
layers narrowed by `oasr_ops.error_budget_filter(..., E)` measured on the calibration batches against the fp32
model's outputs (layers by budget spent per FLOP, as many as keep the joint eager error <= E), calibrated,
fuse_quantization="act"; --with-error-order adds -budget-err (the layers by their own error alone); the JSON's
"error_budget" holds each variant's layers, the measured errors and the seconds it took. --profile N: the
top kernels of N calls of int8-fused without CUDA graphs (`e2e_conformer.profile`; --profile-fp16 adds fp16
inductor). --device cpu runs the same logic once, untimed (a smoke test).
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config  # noqa: F401  (torch._inductor.config.patch: the -frz variants)

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")


# a variant option of this benchmark's own (not the backend's): compile with torch._inductor.config.freezing, set
# around the first call (an `options` entry would come too late: Dynamo decides then whether weights are inputs)
FREEZE = "_freezing"


def _kwargs(s):
    from e2e_compare import _kwargs as kw

    return kw(s)


def ctc_greedy(logits: torch.Tensor) -> list[list[int]]:
    ids = logits.argmax(-1).cpu()
    out = []
    for row in ids:
        toks, prev = [], -1
        for t in row.tolist():
            if t != prev and t != 0:
                toks.append(t)
            prev = t
        out.append(toks)
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def accuracy(out: torch.Tensor, ref: torch.Tensor, head: torch.nn.Module, ref_tokens, ref_argmax) -> dict:
    with torch.no_grad():
        logits = head(out.float())
    toks = ctc_greedy(logits)
    errs = sum(edit_distance(r, t) for r, t in zip(ref_tokens, toks))
    n = max(1, sum(len(r) for r in ref_tokens))
    return {"rel_err_vs_fp32": ((out.float() - ref).abs().max() / ref.abs().max()).item(),
            "ctc_frame_agreement": (logits.argmax(-1) == ref_argmax).float().mean().item(),
            "ctc_token_error_rate": errs / n}


def latency_ms(fn, x, iters: int) -> float:
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*x)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def call_overheads_ms(fn, x, iters: int) -> tuple[float, float, list[float]]:
    """(host ms per call, pipelined ms per call). The latency above counts the host work before the launch (Dynamo's
    guards, the CUDA-graph tree's input checks: they grow with the number of parameter / buffer inputs) as GPU idle
    time; here the host time of one call (no sync inside it) and the time per call of `iters` calls back to back
    (the host work of a call overlaps the GPU work of the previous one) separate the two."""
    host = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*x)
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn(*x)
    e.record()
    e.synchronize()
    return statistics.median(host), s.elapsed_time(e) / iters, host


def host_profile(fn, x, calls: int, top: int = 30) -> dict:
    """cProfile of `calls` back-to-back calls (one sync at the end): the functions with the most own time, and
    the total host ms per call the profiler saw (inflated by cProfile's own cost; compare variants, not absolutes)."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*x)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = sorted(((v[2], v[3], v[1], f"{Path(k[0]).name}:{k[1]}({k[2]})") for k, v in stats.stats.items()),
                  reverse=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    return {"calls": calls, "ms_per_call": 1e3 * stats.total_tt / calls,
            "top_own": [{"own_ms_per_call": 1e3 * t / calls, "cum_ms_per_call": 1e3 * c / calls,
                         "ncalls_per_call": n / calls, "where": w} for t, c, n, w in rows[:top]],
            "cumulative": buf.getvalue()[-6000:]}


def main() -> int:
    from e2e_compare import add_model_arguments

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--calib-batches", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--with-unfused", action="store_true", help="also time int8-all (every layer, no fusion)")
    p.add_argument("--with-layout-opt", action="store_true",
                   help="also time int8-fused-act-lo: int8-fused-act with Inductor's layout optimization forced on "
                        "(oasr serves the depthwise convs, so Inductor sees 2 convolutions in a ~1000-node graph and "
                        "turns channels-last off; cuDNN then transposes the frontend's conv2d tensors)")
    p.add_argument("--with-act-only", action="store_true",
                   help="also time int8-fused-act: the same int8 layers, only GEMM+activation fused (the LayerNorms' "
                        "quantization left to Inductor, which fuses it with the LayerNorm and the residual add)")
    p.add_argument("--with-fp16-oasr", action="store_true",
                   help="also time fp16 with backend='oasr' (no quantization): separates what int8 adds from what "
                        "oasr's fp16 rewrites (conv module, frontend) already give")
    p.add_argument("--host-profile", type=int, default=0,
                   help="cProfile N back-to-back calls of each variant (after the timed rounds) and keep the top "
                        "functions by own time: where the host time per call goes")
    p.add_argument("--with-residual", action="store_true",
                   help="also time int8-fused-act-res: int8-fused-act with the residual add in fc2's epilogue "
                        "(oasr.scaled_mm_residual; the backend's default with fuse_quantization, which the other "
                        "int8-fused variants turn off to measure what they name); with fp8, the fp8 -res variants "
                        "(docstring)")
    p.add_argument("--with-siblings", action="store_true",
                   help="also time int8-fused-sib: int8-fused-res (fuse_quantization=True, fuse_residual=True) with "
                        "fuse_siblings=True (the q/k/v GEMMs sharing layer_norm_quant's int8 rows as one GEMM of "
                        "N = 3d on the concatenated weights; opt-in: docs/perf/e2e.md, session 7)")
    p.add_argument("--with-freezing", action="store_true",
                   help="also time int8-fused-res-frz, int8-fused-sib-frz, int8-fused-act-res-frz and the baseline "
                        "fp16-frz (fp16 backend='inductor'): those variants compiled with "
                        "torch._inductor.config.freezing (weights as constants: per-call weight transforms — the "
                        "sibling pass's weight concatenation, bias casts, conv weight permutes, BatchNorm folds — "
                        "run once at compile time instead of every call)")
    p.add_argument("--with-fp16-convs", action="store_true",
                   help="also time int8-fused-act-res-fp16conv: int8-fused-act-res with the frontend's convs left "
                        "fp16 (Int8W8A8Config(convs=False): the int8 layers before session 10), to measure what the "
                        "int8 second conv and the first conv's int8 output add")
    p.add_argument("--with-options", action="store_true",
                   help="also time the in-graph path (options={'quantization': ...}) on the fp16 model: "
                        "<q>-opt-all (every qualifying layer, uncalibrated), <q>-opt-fusable (layers='fusable', "
                        "uncalibrated: the layers after a LayerNorm), <q>-opt-fusable-cal (the model calibrated "
                        "first: fc2 too); with --with-freezing also <q>-opt-all-frz, <q>-opt-fusable-cal-frz and "
                        "<q>-opt-plain-cal-frz (options={'quantization': <q scheme string>, 'freezing': True} and "
                        "nothing else: the backend's defaults)")
    p.add_argument("--with-all-res", action="store_true",
                   help="also time int8-all-fused-res: every qualifying Linear int8 and calibrated, "
                        "fuse_quantization=True and fuse_residual=True")
    p.add_argument("--profile", type=int, default=0, help="profile N calls of int8-fused (no CUDA graphs)")
    p.add_argument("--profile-fp16", action="store_true", help="with --profile: also fp16 inductor")
    p.add_argument("--profile-variants", default=None,
                   help="with --profile: the variants to profile, comma-separated (default: the int8 ones timed, "
                        "plus fp16 with --profile-fp16)")
    p.add_argument("--error-budget", type=float, default=None,
                   help="also time <scheme>-fused-act-budget: the fusable layers within this max error vs fp32")
    p.add_argument("--with-error-order", action="store_true",
                   help="with --error-budget: also <scheme>-fused-act-budget-err, the budget's layers by error alone")
    p.add_argument("--quantization", choices=("int8_w8a8", "fp8_w8a8"), default="int8_w8a8",
                   help="fp8_w8a8: time fp8-fused-act and fp8-fused (and fp8-all with --with-unfused) instead of the int8 variants")
    p.add_argument("--only", default=None,
                   help="time only these variants (comma-separated names, fp16 always kept as the baseline): keeps a "
                        "GPU call short when the other variants were measured before")
    p.add_argument("--recursive-dict-tags", action="store_true",
                   help="set torch._dynamo.config.use_recursive_dict_tags_for_guards for every variant (the fp16 "
                        "baseline too): Dynamo then skips the guards of modules whose dicts did not change, the "
                        "largest part of the host time per call (docs/perf/e2e.md)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import oasr_ops
    from e2e_compare import _load, with_fastpath

    if a.recursive_dict_tags:
        if not hasattr(torch._dynamo.config, "use_recursive_dict_tags_for_guards"):
            p.error(f"--recursive-dict-tags: torch {torch.__version__} has no use_recursive_dict_tags_for_guards")
        torch._dynamo.config.use_recursive_dict_tags_for_guards = True
    from oasr_ops.families.self_attention import convertible
    from oasr_ops.inductor.fuse_quant import FUSE_LOG
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_residual import RESIDUAL_LOG
    from oasr_ops.inductor.fuse_siblings import SIBLING_LOG

    dev, cuda = a.device, a.device == "cuda"
    mode = "reduce-overhead" if cuda else "default"
    build, inputs = _load(a.model), _load(a.inputs)
    margs, iargs = _kwargs(a.model_args), _kwargs(a.input_args)
    model = build(**margs, dtype=torch.float16, device=dev, seed=0).eval()
    x = tuple(inputs(**iargs, dtype=torch.float16, device=dev, seed=1))
    ref_model = build(**margs, dtype=torch.float32, device=dev, seed=0).eval()
    calib = [tuple(inputs(**iargs, dtype=torch.float16, device=dev, seed=100 + i)) for i in range(a.calib_batches)]
    with torch.no_grad():
        ref = ref_model(*(t.float() if t.is_floating_point() else t for t in x)).float()
        # the error budget is measured on the calibration batches (not on x, the timed and scored input)
        calib_ref = ([ref_model(*(t.float() if t.is_floating_point() else t for t in b)).float() for b in calib]
                     if a.error_budget is not None else None)
    del ref_model
    torch.manual_seed(123)
    head = torch.nn.Linear(ref.shape[-1], a.vocab).to(dev)
    with torch.no_grad():
        ref_logits = head(ref)
    ref_tokens, ref_argmax = ctc_greedy(ref_logits), ref_logits.argmax(-1)
    print(f"fp32 reference: {tuple(ref.shape)}, {sum(len(t) for t in ref_tokens)} greedy CTC tokens", flush=True)

    t0 = time.perf_counter()
    flt = oasr_ops.fusable_filter(copy.deepcopy(model), *x)
    torch.compiler.reset()
    fp8 = a.quantization == "fp8_w8a8"
    qmodel = oasr_ops.quantize_(copy.deepcopy(model), a.quantization, filter_fn=flt)
    scales = oasr_ops.calibrate(qmodel, calib)
    n_int8 = sum(isinstance(m, oasr_ops.Fp8QuantLinear if fp8 else oasr_ops.QuantLinear) for m in qmodel.modules())
    # a stock nn.MultiheadAttention's packed in-projection is a Linear to quantize_ (LinearMultiheadAttention)
    n_lin = sum(isinstance(m, torch.nn.Linear) + convertible(m) for m in model.modules())
    n_conv = sum(isinstance(m, oasr_ops.QuantConv2d) for m in qmodel.modules())
    print(f"int8 layers: {n_int8} of {n_lin} linears, {n_conv} conv2d; {len(scales)} calibrated "
          f"({time.perf_counter() - t0:.1f}s)", flush=True)
    variants = {"fp16": (copy.deepcopy(model), "inductor", {}),
                "int8-fused": (qmodel, oasr_backend, {"fuse_quantization": True, "fuse_residual": False})}
    if a.with_fp16_oasr:
        variants["fp16-oasr"] = (copy.deepcopy(model), oasr_backend, {})
    if a.with_act_only:
        variants["int8-fused-act"] = (copy.deepcopy(qmodel), oasr_backend,
                                      {"fuse_quantization": "act", "fuse_residual": False})
    if a.with_residual:
        variants["int8-fused-act-res"] = (copy.deepcopy(qmodel), oasr_backend,
                                          {"fuse_quantization": "act", "fuse_residual": True})
        variants["int8-fused-res"] = (copy.deepcopy(qmodel), oasr_backend,
                                      {"fuse_quantization": True, "fuse_residual": True})
    if a.with_siblings:
        variants["int8-fused-sib"] = (copy.deepcopy(qmodel), oasr_backend,
                                      {"fuse_quantization": True, "fuse_residual": True, "fuse_siblings": True})
    if a.with_freezing:  # the weights as constants: per-call weight transforms (casts, permutes, folds) fold away
        variants["fp16-frz"] = (copy.deepcopy(model), "inductor", {FREEZE: True})  # the baseline frozen too
        variants["int8-fused-act-res-frz"] = (copy.deepcopy(qmodel), oasr_backend,
                                              {"fuse_quantization": "act", "fuse_residual": True, FREEZE: True})
        variants["int8-fused-res-frz"] = (copy.deepcopy(qmodel), oasr_backend,
                                          {"fuse_quantization": True, "fuse_residual": True, FREEZE: True})
        variants["int8-fused-sib-frz"] = (copy.deepcopy(qmodel), oasr_backend,
                                          {"fuse_quantization": True, "fuse_residual": True, "fuse_siblings": True,
                                           FREEZE: True})
    if a.with_fp16_convs and not fp8:
        noconv = oasr_ops.quantize_(copy.deepcopy(model), oasr_ops.Int8W8A8Config(convs=False), filter_fn=flt)
        oasr_ops.calibrate(noconv, calib)
        variants["int8-fused-act-res-fp16conv"] = (noconv, oasr_backend,
                                                   {"fuse_quantization": "act", "fuse_residual": True})
    if a.with_all_res:
        # every qualifying Linear int8 (the attention out-projection too: its residual add rides in its epilogue,
        # its input quantization is a separate pass), calibrated, LayerNorms + fc1 fused, residuals fused
        allq = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
        oasr_ops.calibrate(allq, calib)
        variants["int8-all-fused-res"] = (allq, oasr_backend, {"fuse_quantization": True, "fuse_residual": True})
    if a.with_layout_opt:
        variants["int8-fused-act-lo"] = (copy.deepcopy(qmodel), oasr_backend,
                                         {"fuse_quantization": "act", "force_layout_optimization": True,
                                          "fuse_residual": False})
    if a.with_unfused:
        variants["int8-all"] = (oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8"), oasr_backend,
                                {"fuse_quantization": False})
    budget_variants: dict[str, tuple] = {}
    if a.error_budget is not None:
        res_budget: dict[str, dict] = {}
        sens = None
        # -budget: the default order (budget spent per FLOP); -budget-err (--with-error-order): by error alone
        orders = {"budget": oasr_ops.sensitivity.weight_numel}
        if a.with_error_order:
            orders["budget-err"] = lambda module, fqn: 1.0
        for suffix, gain in orders.items():
            t0 = time.perf_counter()
            plan = oasr_ops.error_budget_filter(copy.deepcopy(model), calib, a.quantization, a.error_budget,
                                                filter_fn=flt, reference=calib_ref, gain=gain, sensitivity=sens)
            secs = time.perf_counter() - t0  # the first includes the per-layer sensitivity, the others reuse it
            sens = plan.sensitivity
            bmodel = oasr_ops.quantize_(copy.deepcopy(model), a.quantization, filter_fn=plan)
            oasr_ops.calibrate(bmodel, calib)
            name = f"{a.quantization.split('_')[0]}-fused-act-{suffix}"
            budget_variants[name] = (bmodel, oasr_backend, {"fuse_quantization": "act"})
            res_budget[name] = {"max_error": a.error_budget, "layers": list(plan.layers),
                                "candidates": len(plan.sensitivity.layers), "eager_error": plan.error,
                                "baseline": plan.sensitivity.baseline,
                                "measured": {str(k): v for k, v in plan.measured.items()}, "seconds": secs}
            print(f"{name}: {plan.summary()} ({secs:.1f}s)", flush=True)
        print(sens.table(top=10), flush=True)
        budget_info = {"sensitivity": sens.layers, "variants": res_budget}
        if not fp8:
            variants.update(budget_variants)
    for _m, _backend, opts in variants.values():  # only the -sib variants fuse siblings, whatever the default
        if "fuse_quantization" in opts:
            opts.setdefault("fuse_siblings", False)
    if fp8:  # the fp8 variants replace the int8 ones (docstring)
        no_res = {"fuse_residual": False}  # what these variants measured before the fp8 residual epilogue existed
        variants = {"fp16": variants["fp16"],
                    "fp8-fused-act": (qmodel, oasr_backend, {"fuse_quantization": "act", **no_res}),
                    "fp8-fused": (copy.deepcopy(qmodel), oasr_backend, {"fuse_quantization": True, **no_res})}
        if a.with_unfused:
            variants["fp8-all"] = (oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8"), oasr_backend,
                                   {"fuse_quantization": False})
        for name, (m, backend, opts) in budget_variants.items():
            variants[name] = (m, backend, {**opts, **no_res})
            if a.with_residual:
                variants[f"{name}-res"] = (copy.deepcopy(m), backend, {**opts, "fuse_residual": True})
        if a.with_residual:
            variants["fp8-fused-act-res"] = (copy.deepcopy(qmodel), oasr_backend,
                                             {"fuse_quantization": "act", "fuse_residual": True})
            variants["fp8-fused-res"] = (copy.deepcopy(qmodel), oasr_backend,
                                         {"fuse_quantization": True, "fuse_residual": True})
    if a.with_options:  # the in-graph path: the fp16 model itself, quantized by the backend's graph pass
        q = a.quantization.split("_")[0]
        config_type = oasr_ops.Fp8W8A8Config if fp8 else oasr_ops.Int8W8A8Config
        fusable, every = config_type(layers="fusable"), config_type(layers="all")  # named: the default may change

        def calibrated():  # each its own copy: a scale is kept per weight (a deepcopy's weights have none)
            m = copy.deepcopy(model)
            oasr_ops.calibrate(m, calib, scheme=a.quantization)  # plain layers: the scale goes into the graph
            return m

        opt_variants = {
            f"{q}-opt-all": (copy.deepcopy(model), {"quantization": every}),
            f"{q}-opt-fusable": (copy.deepcopy(model), {"quantization": fusable}),
            f"{q}-opt-fusable-cal": (calibrated(), {"quantization": fusable})}
        if a.with_freezing:
            opt_variants[f"{q}-opt-all-frz"] = (copy.deepcopy(model), {"quantization": every, FREEZE: True})
            opt_variants[f"{q}-opt-fusable-cal-frz"] = (calibrated(), {"quantization": fusable, FREEZE: True})
            # what the bare scheme string gives, every other option at the backend's default (fusion included)
            opt_variants[f"{q}-opt-plain-cal-frz"] = (calibrated(), {"quantization": a.quantization, FREEZE: True})
        for name, (m, opts) in opt_variants.items():
            fusion = {} if "-plain" in name else {"fuse_quantization": True, "fuse_siblings": False}
            variants[name] = (m, oasr_backend, {**opts, **fusion})
    if a.only:
        keep = {"fp16", *a.only.split(",")}
        unknown = keep - set(variants)
        if unknown:
            p.error(f"--only: unknown variants {sorted(unknown)}; these flags give {sorted(variants)}")
        variants = {n: v for n, v in variants.items() if n in keep}
    fns, res = {}, {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d"), "model": a.model, "model_args": margs, "inputs": iargs,
                    "mode": mode, "rounds": a.rounds, "iters": a.iters, "int8_layers": n_int8, "linears": n_lin,
                    "quantization": a.quantization, "recursive_dict_tags": a.recursive_dict_tags, "int8_conv2d": n_conv,
                    "first_call_s": {}, "accuracy": {}, "round_ms": {}}
    if budget_variants:
        res["error_budget"] = budget_info
    # No torch.compiler.reset() between variants: it drops every earlier variant's compiled code, which then
    # recompiles lazily inside the first timed round — outside its freezing patch (a -frz variant timed unfrozen)
    # and after the tree of CUDA graphs was reset. Every variant is the same model class, so all share one forward
    # code object: Dynamo keeps one cache entry per backend there, up to its recompile limit (8), beyond which a
    # variant would silently run eager. Raise the limit to the number of variants.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(variants) + 8)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           16 * len(variants) + 64)
    first_out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, (m, backend, opts) in variants.items():
            marks = FUSE_LOG.mark(), RESIDUAL_LOG.mark(), SIBLING_LOG.mark()  # this variant's compile reports
            opts = dict(opts)
            freeze = opts.pop(FREEZE, False)
            # A backend per variant that compares unequal to every other: Dynamo reuses a cache entry across
            # instances of one class when the backends compare equal (torch.compile's wrappers compare their
            # options), so two variants whose options differ only in the model's calibration or in the freezing
            # patch would run one compiled graph (seen on the CPU: -opt-fusable-cal-frz ran -opt-fusable's).
            if backend == "inductor":
                fn = (torch.compile(m, backend="inductor", options={**torch._inductor.list_mode_options(mode),
                                                                    "freezing": True}) if freeze else
                      torch.compile(m, backend="inductor", mode=mode))
            else:
                fn = torch.compile(m, backend=functools.partial(backend, options={**opts, "mode": mode}))
            if "-opt-" in name:  # the fp16 model itself: a stock encoder's fast path would hide its Linears
                fn = with_fastpath(fn, False)
            t0 = time.perf_counter()
            with torch._inductor.config.patch(freezing=freeze):  # traced and compiled on this first call
                out = fn(*x)
            if cuda:
                torch.cuda.synchronize()
            res["first_call_s"][name] = time.perf_counter() - t0
            for _ in range(3 if cuda else 0):
                out = fn(*x)
            res["accuracy"][name] = accuracy(out, ref, head, ref_tokens, ref_argmax)
            first_out[name] = out.detach().float().clone()
            reps, rr, sr = FUSE_LOG.since(marks[0]), RESIDUAL_LOG.since(marks[1]), SIBLING_LOG.since(marks[2])
            if reps:
                res.setdefault("fusion", {})[name] = {
                    "layer_norm_quant": sum(r.layer_norm_quant for r in reps),
                    "act_quant": sum(r.act_quant for r in reps),
                    "conv_quant": sum(r.conv_quant for r in reps), "conv_act": sum(r.conv_act for r in reps),
                    "unfused": [u for r in reps for u in r.unfused][:20]}
            if rr:  # the int8-fused-act-res variant: adds absorbed by fc2's epilogue
                res.setdefault("residual", {})[name] = {"fused": sum(r.fused for r in rr),
                                                        "unfused": [u for r in rr for u in r.unfused][:20]}
            if any(r.groups or r.unfused for r in sr):  # int8-fused-sib: q/k/v as one GEMM
                res.setdefault("siblings", {})[name] = {"groups": sum(r.groups for r in sr),
                                                        "widths": sorted({str(w) for r in sr for w in r.widths}),
                                                        "views_to_reshape": sum(r.views_to_reshape for r in sr),
                                                        "unfused": [u for r in sr for u in r.unfused][:20]}
            print(name, res["first_call_s"][name], res["accuracy"][name], res.get("fusion", {}).get(name),
                  res.get("residual", {}).get(name, ""), res.get("siblings", {}).get(name, ""), flush=True)
            fns[name] = fn
            res["round_ms"][name] = []
        for r in range(a.rounds if cuda else 0):
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]
            for name in order:
                res["round_ms"][name].append(latency_ms(fns[name], x, a.iters))
                host, piped, host_calls = call_overheads_ms(fns[name], x, a.iters)
                res.setdefault("host_call_ms", {}).setdefault(name, []).append(host)
                # every call's host time, not only the median: session 7 saw the median of one variant move
                # 0.3 -> 0.85 ms between rounds; the spread within a round says whether that is a few outliers
                res.setdefault("host_calls_ms", {}).setdefault(name, []).append([round(h, 4) for h in host_calls])
                res.setdefault("pipelined_ms", {}).setdefault(name, []).append(piped)
            print(f"round {r}: " + "  ".join(f"{n} {res['round_ms'][n][-1]:.3f} ms (host {res['host_call_ms'][n][-1]:.3f},"
                                             f" pipelined {res['pipelined_ms'][n][-1]:.3f})" for n in fns), flush=True)
        # Each variant, after every other was compiled and timed, must still run the graph it was compiled (and
        # its accuracy measured) with: the same output as its first call, up to run-to-run noise. A variant that
        # ran another's graph (a calibrated one running the uncalibrated, a frozen one the unfrozen) differs by
        # the quantization's error. Recorded per variant; a mismatch is printed.
        res["same_graph_after_timing"] = {}
        for name, fn in fns.items():
            again = fn(*x).float()
            drift = ((again - first_out[name]).abs().max() / first_out[name].abs().max().clamp_min(1e-12)).item()
            res["same_graph_after_timing"][name] = {"rel_drift": drift, "same": drift < 1e-3}
            if drift >= 1e-3:
                print(f"WARNING: {name} no longer runs its own compiled graph (output drift {drift:.2e} vs its "
                      f"first call): its timings are of another variant's graph", flush=True)
        if a.host_profile and cuda:  # inside no_grad: a call with grad on would recompile (and fail: no backward)
            res["host_profile"] = {n: host_profile(fns[n], x, a.host_profile) for n in fns}
    if cuda:
        summary = {}
        for n, ts in res["round_ms"].items():
            med = statistics.median(ts)
            summary[n] = {"median_ms": med, "spread_pct": 100 * (max(ts) - min(ts)) / med,
                          "host_call_ms": statistics.median(res["host_call_ms"][n]),
                          "pipelined_ms": statistics.median(res["pipelined_ms"][n])}
        if "int8-fused" in summary:
            summary["fp16_over_int8_fused"] = summary["fp16"]["median_ms"] / summary["int8-fused"]["median_ms"]
        for n in fns:
            if n not in ("fp16", "int8-fused"):
                summary[f"fp16_over_{n}"] = summary["fp16"]["median_ms"] / summary[n]["median_ms"]
            if n != "fp16":
                summary[f"fp16_over_{n}_pipelined"] = summary["fp16"]["pipelined_ms"] / summary[n]["pipelined_ms"]
        res["summary"] = summary
        print(json.dumps(summary, indent=1), flush=True)
    if a.profile and cuda:
        from e2e_conformer import profile

        # the "before" profiles (fp16 oasr, unfused int8) are benchmarks/logs/sm90_e2e_conformer_M_int8_profile.json
        # (`device_run.sh e2e-profile`). Each variant is compiled with its own fusion options (the pass is opt-in:
        # without them the profile would be of unfused int8).
        names = (a.profile_variants.split(",") if a.profile_variants else
                 [n for n in variants if n != "fp16"] + (["fp16"] if a.profile_fp16 else []))
        res["profile"] = {}
        for n in names:
            m, backend, opts = variants[n]
            opts = dict(opts)
            with torch._inductor.config.patch(freezing=opts.pop(FREEZE, False)):
                label = "oasr+int8" if n.startswith(("int8", "fp8")) else "oasr"  # the printed label only
                res["profile"][n] = (profile(m, "inductor", x[0], a.profile, False) if backend == "inductor" else
                                     profile(m, label, x[0], a.profile, False, opts))
    res["tuning_report"] = oasr_ops.tuning_report(print_=False)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
