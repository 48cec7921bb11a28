"""The `oasr` torch.compile backend: Inductor with the oasr rewrite in `post_grad_custom_pre_pass`.

Registered ONLY through the ``torch_dynamo_backends`` entry point in setup.py (``oasr =
oasr_ops.inductor.backend:oasr_backend``), so ``torch.compile(m, backend="oasr")`` works after ``pip install``
without importing oasr_ops first. Calling `torch._dynamo.register_backend` here as well would make Dynamo
raise "duplicate name". A checkout that is not installed can pass the function
itself: ``torch.compile(m, backend=oasr_ops.inductor.backend.oasr_backend)``.

``torch.compile`` forwards ``mode`` and ``options`` to a non-Inductor backend as keyword arguments (only when
non-default):

* ``mode``: mapped like Inductor does, through `torch._inductor.list_mode_options` (``reduce-overhead`` ->
  ``{"triton.cudagraphs": True}``, ``max-autotune`` -> ...). `torch.compile` refuses ``mode`` together with
  ``options`` ("Either mode or options can be specified"), so the mode may also be given as
  ``options={"mode": "reduce-overhead", ...}``.
* ``options={"tuning": TuningConfig(...)}``: with ``mode="prewarm"`` the graph's GEMM points that no DB tier
  covers are measured into the user tier before the graph is compiled; with ``strict=True`` an uncovered point
  raises `UncoveredPointsError` instead of compiling with fallbacks. Every other option is an Inductor config
  patch (e.g. ``{"max_autotune": True}``); a ``post_grad_custom_pre_pass`` option runs after ours. A key that is
  neither (a typo), an unknown mode, or options that are not a dict are refused before anything runs.
* ``options={"quantization": "int8_w8a8"}``: quantize the graph's linears (`quantize_pass`): by default only those
  whose input quantization fuses into the producer (``Int8W8A8Config.layers="fusable"``; ``"all"`` takes every
  qualifying one, measured slower than 16 bits end to end). Then, for every int8
  graph (that one or a `quantize_`d model's), the fusion pass (`fuse_quant`) moves activation quantization into
  its producer: LayerNorm -> `oasr.layer_norm_quant`, GEMM + GELU/SiLU -> `oasr.scaled_mm_act_quant` (with a
  calibrated scale, `oasr_ops.calibrate`). On by default (``fuse_quantization=True``; a no-op on a graph with no
  quantized layer) since session 33: the bare scheme string on a calibrated, frozen Conformer M ran 1.31x of fp16
  Inductor without it and 1.74x with it (docs/perf/e2e.md); ``False`` turns it off, and ``"act"`` is the other mode
  (some models measured faster with it: the Conformer in session 7);
  ``"act"`` fuses only GEMM -> activation -> quantization and leaves the LayerNorms' quantization to Inductor.
  fp8 graphs (``"fp8_w8a8"``, either form) get the same: GEMM + GELU/SiLU -> `oasr.scaled_mm_fp8_act_quant` and,
  with ``True``, LayerNorm -> `oasr.layer_norm_quant(..., scheme="fp8")`.
* ``options={"fuse_residual": ...}`` (default: on when ``fuse_quantization`` is, off otherwise; measured gains):
  an int8 or fp8 GEMM whose output is only added to the residual stream (``x + 0.5 * fc2(h)``, ``x + proj(h)``)
  becomes one `oasr.scaled_mm_residual` / `oasr.scaled_mm_fp8_residual` call, the add in the GEMM's epilogue
  (`fuse_residual`); applied after the quantization fusion; ``True`` / ``False`` override the default.
* ``options={"fuse_siblings": True}`` (opt-in; measured: lower latency, not higher throughput): int8 GEMMs
  that read the same quantized input (an attention block's q / k / v after `oasr.layer_norm_quant`) become one
  `oasr.scaled_mm` on their concatenated weights, each consumer reading a column slice (`fuse_siblings`); applied
  after the residual fusion. The weight concatenation runs on every call (constant-folded under Inductor's
  freezing, ``torch._inductor.config.freezing = True`` before compiling).
* ``options={"cpp_hot_path": False}``: keep the oasr ops on their Python implementations when compiling without
  CUDA graphs (below; default True).
* ``options={"eager_regions": False}``: bake the same configs without CUDA graphs as with them (below; default True).
* ``options={"freezing": True}``: freezes nothing (Dynamo makes parameters graph constants only under the global
  ``torch._inductor.config.freezing``, read while it traces): dropped with one warning that says so.

Without CUDA graphs (no ``reduce-overhead`` mode, no ``triton.cudagraphs``) a graph on CUDA tensors bakes the
tuning DB's ``regions_eager`` where an entry has them (tune/serving_regions.py: where the graph table serves cuBLAS
through `oasr::gemm` at a launch-bound M, a measured tile costs less host time per call), and switches the ops
the C++ hot path serves (`oasr::gemm`, the int8 GEMMs, `oasr::conv1d_depthwise`) to it (option ``cpp_hot_path``,
default True) and warns once per process: the other oasr ops still pay their Python host time, and at a few
utterances per batch the served model can still be slower than Inductor's (`_serve_without_cuda_graphs`).

Everything else (fusion of the surrounding pointwise ops, CUDA graphs, caching) is Inductor's:
`compile_fx(gm, example_inputs, config_patches=...)`. When that compile is an FX/AOT cache hit (our pass did not
run), the graph is recorded for the tuning report (`rewrite.record_cache_hit`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import torch
import torch._inductor.config as inductor_config

from ..runtime.plans import WarnOnce
from . import rewrite
from .rewrite import ChainedPass, OasrRewritePass


def _config_patches(mode: str | None, options: dict[str, Any], example_inputs: Sequence[Any] = (),
                    eager_regions: bool = True) -> dict[str, Any]:
    """Inductor's config patches for `mode` + `options`, with our pass (before a user's). The pass bakes the DB's
    eager regions when the graph will run without CUDA graphs on CUDA tensors (and ``eager_regions``)."""
    patches: dict[str, Any] = {}
    if mode and mode != "default":
        import torch._inductor as inductor

        patches.update(inductor.list_mode_options(mode))
    patches.update(options)
    _keep_small_constants_under_freezing(patches)
    eager = eager_regions and not _uses_cuda_graphs(patches) and _any_cuda(example_inputs)
    ours = OasrRewritePass(eager=eager)
    user_pass = patches.pop("post_grad_custom_pre_pass", None)
    patches["post_grad_custom_pre_pass"] = ours if user_pass is None else ChainedPass(ours, user_pass)
    return patches


def _keep_small_constants_under_freezing(patches: dict[str, Any]) -> None:
    """Under freezing, keep the graph's constants as tensors (``always_keep_tensor_constants``) unless the options
    say otherwise. Inductor otherwise inlines every 1-D constant of <= 8 values into a kernel that writes it to a
    fresh buffer on each call: a quantizing op's per-tensor ``out_scale`` (shape [1]) then arrives as a new tensor
    every call, which the C++ hot path cannot take as checked (its values must be read again: a device sync per
    call, measured on the H200 in session 22 as one Python act-quant call per forward). Without freezing those
    scales are graph inputs, tensors already; the constants this keeps are a few scalars."""
    if inductor_config.freezing:  # (options={"freezing": True} freezes nothing: `_check_freezing`)
        patches.setdefault("always_keep_tensor_constants", True)


_warn_once = WarnOnce()


# PyTorch's fused inference fast paths (eval, no grad): the layer is one native op in the graph, so no pass sees
# its Linears. Dynamo has already chosen the path when the backend gets the graph: only the user can turn it off.
_FAST_PATHS = {"_transformer_encoder_layer_fwd": "nn.TransformerEncoderLayer",
               "_native_multi_head_attention": "nn.MultiheadAttention"}


def _warn_fast_paths(gm: torch.fx.GraphModule) -> None:
    """One warning when the graph holds a module on its fused fast path (`_FAST_PATHS`)."""
    names = {getattr(n.target, "__name__", "") for n in gm.graph.nodes if n.op == "call_function"}
    hit = sorted({mod for op, mod in _FAST_PATHS.items() if op in names})
    if hit:
        _warn_once("fast-path", f'backend="oasr": {" and ".join(hit)} ran on PyTorch\'s fused inference fast path '
                   "(one native op per layer): no oasr kernel serves its GEMMs; it runs as under Inductor. "
                   "torch.backends.mha.set_fastpath_enabled(False) before compiling gives the backend its Linears, "
                   "but measured slower on the H200 in fp16 (a Whisper-small-sized nn.TransformerEncoder: 0.89x of "
                   "Inductor on the fast path; docs/perf/e2e.md). Quantization leaves the fast path by itself: "
                   "options={'quantization': ...} spells the layer out, quantize_(model, ...) keeps quantized "
                   "layers off it")


def _any_cuda(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)


def _uses_cuda_graphs(patches: dict[str, Any]) -> bool:
    return bool(patches.get("triton.cudagraphs", inductor_config.triton.cudagraphs))


def _serve_without_cuda_graphs(patches: dict[str, Any], example_inputs: list[Any], cpp_hot_path: bool) -> None:
    """A CUDA graph compiled without CUDA graphs: each oasr op call then costs its host time, and a host-bound model
    (small batches; on a slow host every batch) can run slower than backend="inductor". So the ops the C++ hot path
    serves (families/hot_path.py: gemm, the int8 and fp8 GEMMs, the depthwise conv, layer_norm_quant) are switched to it
    (unless ``cpp_hot_path=False``; built once like a kernel, a failure keeps the Python ops), and one warning per
    process says what is left — measured on the H200 (docs/perf/e2e.md, "The eager floor", "layer_norm_quant on the
    C++ hot path"), variable-length traffic vs fp16 Inductor: with the hot path fp16 1.31-1.35x and int8 1.14-1.24x
    overall, int8 0.84-0.93x at 1 utterance per batch; without it fp16 0.77-0.90x, int8 0.67x. Unless the graph is
    frozen it also names freezing (sessions 23-25: frozen fp16 and frozen int8 both ~1.42x, unfrozen 1.32x and
    1.11x). With mode="reduce-overhead" there is no host path to speed up."""
    if _uses_cuda_graphs(patches) or not _any_cuda(example_inputs):
        return
    why_not = "off (cpp_hot_path=False)"
    if cpp_hot_path:
        from torch.utils._python_dispatch import _disable_current_modes

        from ..families import hot_path

        try:
            if hot_path.enabled() != "CUDA":  # on already (e.g. the user's `enable_cpp_hot_path(ops=...)`): kept
                with _disable_current_modes():  # registering kernels is no tensor op for a tracing mode to see
                    hot_path.enable("CUDA")
            why_not = ""
        except Exception as e:  # noqa: BLE001 - documented fallback: the Python op, said in the warning below
            why_not = f"unavailable ({e})"
    host = ("gemm, the int8 and fp8 GEMMs, the depthwise conv and layer_norm_quant run on the C++ hot path, the "
            "other oasr ops add Python host time per call" if not why_not
            else f"the C++ hot path of the oasr ops is {why_not}: every oasr op call adds Python host time")
    # Not frozen, every per-call weight transform (BatchNorm folds, casts, permutes) is a launch of its own; frozen
    # they fold once (docs/perf/e2e.md, sessions 23-25: int8 frozen 1.44x vs unfrozen 1.11x; fp16 frozen 1.49x vs
    # 1.32x; both frozen in one process: level at 1.42x)
    freeze = ("" if inductor_config.freezing else
              '; where CUDA graphs do not fit the traffic, compile with torch._inductor.config.freezing = True '
              "under torch.no_grad() (per-call weight transforms fold once: fp16 measured 1.42-1.49x frozen vs "
              "1.32x unfrozen, int8 1.42-1.44x frozen vs 1.11x: frozen fp16 is as fast as frozen int8 at a fifth "
              "of its error)")
    _warn_once("no-cuda-graphs",
               f'backend="oasr" without CUDA graphs: {host}, so a host-bound model (small batches) can run slower '
               'than backend="inductor" (measured on the H200, variable-length traffic, vs fp16 Inductor: with the '
               'C++ hot path fp16 1.31-1.35x and int8 1.14-1.24x overall, int8 0.84-0.93x at 1 utterance per '
               'batch; without it fp16 0.77-0.90x, int8 0.67x); compile with mode="reduce-overhead" '
               f'(options={{"mode": "reduce-overhead"}}) to serve{freeze} (docs/perf/e2e.md, "Serving traffic '
               'without CUDA graphs")')


def _check_freezing(opts: dict[str, Any]) -> None:
    """``options={"freezing": True}`` cannot freeze: Dynamo decides whether parameters become graph constants while
    it traces (`torch._dynamo.utils.is_parameter_freezing`, torch 2.11-2.13), before any backend sees the graph, and
    it reads the global config; as an option Inductor then folds nothing (measured: the same kernel launches per
    call). The option is dropped with one warning naming what works."""
    if opts.pop("freezing", False) and not inductor_config.freezing:
        _warn_once("freezing-option",
                   'backend="oasr": options={"freezing": True} has no effect (Dynamo decides whether parameters '
                   "become constants when it traces, from the global config, before the backend runs); set "
                   "torch._inductor.config.freezing = True before compiling, under torch.no_grad()")


# The backend's own options (the module docstring); every other key is an Inductor config patch.
OPTIONS = ("mode", "quantization", "fuse_quantization", "fuse_residual", "fuse_siblings", "tuning", "freezing",
           "cpp_hot_path", "eager_regions")


def _check_options(options: dict[str, Any], mode: Any) -> None:
    """ValueError naming an unknown option key (neither the backend's own nor a `torch._inductor.config` option, as
    `torch.compile`'s Inductor accepts them) or an unknown `mode`, before anything is done (Inductor would otherwise
    fail deep inside `compile_fx`'s config patch)."""
    import difflib

    import torch._inductor as inductor

    inductor_keys = inductor_config.get_config_copy()
    unknown = [k for k in options if k not in OPTIONS and k not in inductor_keys]
    if unknown:
        hints = [h[0] for k in unknown for h in [difflib.get_close_matches(str(k), [*OPTIONS, *inductor_keys], n=1)]
                 if h]
        hint = f" (did you mean {', '.join(map(repr, hints))}?)" if hints else ""
        raise ValueError(f'backend="oasr": unknown option(s) {unknown}{hint}; the backend\'s own options are '
                         f"{list(OPTIONS)}, any other key must be a torch._inductor.config option "
                         "(torch._inductor.list_options())")
    modes = list(inductor.list_mode_options())
    if mode is not None and mode not in modes:
        raise ValueError(f'backend="oasr": unknown mode {mode!r}; one of {modes}')


def _switches(opts: dict[str, Any]) -> tuple[Any, bool, bool, bool, bool]:
    """Pop and check the backend's on/off options before any pass runs (a bad value is refused up front, not after
    the quantization and fusion passes): fuse_quantization (default True), fuse_residual (default: follows it),
    fuse_siblings (False), cpp_hot_path (True), eager_regions (True)."""
    fuse = opts.pop("fuse_quantization", True)
    if fuse not in (False, None, True, "act"):
        raise ValueError(f"options['fuse_quantization'] must be True (LayerNorms and GEMM+activation), 'act' (only "
                         f"GEMM+activation; LayerNorm quantization left to Inductor) or False, got {fuse!r}")
    values = {name: opts.pop(name, default) for name, default in
              (("fuse_residual", bool(fuse)), ("fuse_siblings", False), ("cpp_hot_path", True),
               ("eager_regions", True))}
    for name, value in values.items():
        if not isinstance(value, bool):  # a string such as "no" would otherwise read as True
            raise ValueError(f"options['{name}'] must be True or False, got {value!r}")
    return fuse, *values.values()


def oasr_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None,
                 options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Dynamo backend: (optional prewarm / strict check) -> Inductor with the oasr rewrite pass."""
    from torch._inductor.compile_fx import compile_fx

    if options is not None and not isinstance(options, dict):
        raise TypeError(f'backend="oasr": options must be a dict, got {type(options).__name__}')
    opts = dict(options or {})
    opts.update(kwargs)
    mode = opts.pop("mode", None) or mode
    _check_options(opts, mode)
    fuse, fuse_residual, fuse_siblings, cpp_hot_path, eager_regions = _switches(opts)
    quantization = opts.pop("quantization", None)
    guard = None
    if quantization:
        from .quantize_pass import calibration_guard, quantize_graph

        baked: list = []
        quantize_graph(gm, example_inputs, quantization, baked)
        guard = calibration_guard(gm, baked)  # before the fusion passes rewrite the graph (placeholders stay)
    # On by default since session 33 (a no-op on a graph without quantized layers): the bare
    # options={"quantization": "int8_w8a8"} on a calibrated, frozen Conformer M ran 1.31x of fp16 Inductor unfused
    # and 1.74x fused (H100, docs/perf/e2e.md); opt-in before, when the fused graph was not yet measured to pay.
    if fuse:  # LayerNorm / GEMM+activation -> quantization (fuse_quant.py)
        from .fuse_quant import fuse_quantization

        report = fuse_quantization(gm, layer_norms=fuse is True)
        if report.unfused:  # the layers quantize_ / options quantized that the pass could not fuse: say what pays
            _warn_once("unfused-quantization", f"fuse_quantization: {len(report.unfused)} quantized layer input(s) "
                       f"keep a separate quantization pass ({report.unfused[0]}). Measured on the H200 "
                       "(docs/perf/e2e.md), such layers run no faster, or slower, than in 16 bits. An fc2 after a "
                       "quantized fc1 + GELU/SiLU fuses once calibrated (oasr_ops.calibrate before compiling); leave "
                       "the others unquantized: quantize_ with filter_fn=oasr_ops.fusable_filter(model, *inputs), "
                       "or options={'quantization': 'int8_w8a8'} on the 16-bit model (layers='fusable', the "
                       "default, in place of layers='all').")
    # int8 / fp8 GEMM + residual add -> oasr.scaled_mm[_fp8]_residual (fp8 measured in session 35 on an H100: Whisper
    # small 6.41 -> 5.93 ms with True, Conformer M 3.42 -> 3.38 ms with "act"). On by default with fuse_quantization (measured on the H200,
    # docs/perf/e2e.md "Residual adds": Whisper small 6.06 -> 5.70 ms, Conformer M 3.84 -> 3.78 ms with "act", no
    # loss anywhere); off without it (graphs not measured with it). fuse_residual=True/False overrides.
    if fuse_residual:
        from .fuse_residual import fuse_residual_adds

        fuse_residual_adds(gm)
    # int8 GEMMs sharing their quantized input (q/k/v) -> one GEMM of the summed N. Opt-in: measured on the H200
    # (docs/perf/e2e.md, session 7), Whisper-style small synchronous calls 2.7-3.2 % faster in three runs but calls
    # back to back 0.3-1.2 % slower (the weight cats run per call: fuse_siblings.py). After fuse_residual: a GEMM
    # whose output only feeds a residual add gains more there.
    if fuse_siblings:
        from .fuse_siblings import fuse_sibling_gemms

        fuse_sibling_gemms(gm)
    tuning = opts.pop("tuning", None)
    if tuning is not None:
        from ..tune.config import as_tuning_config

        tuning = as_tuning_config(tuning, "options['tuning']")
        if tuning.mode == "prewarm" or tuning.strict:
            from ..tune.prewarm import prewarm_graph

            prewarm_graph(gm, example_inputs, tuning)
    _check_freezing(opts)
    _warn_fast_paths(gm)
    patches = _config_patches(mode, opts, example_inputs, eager_regions)
    _serve_without_cuda_graphs(patches, example_inputs, cpp_hot_path)
    runs = rewrite.pass_runs()
    compiled = compile_fx(gm, example_inputs, config_patches=patches)
    if rewrite.pass_runs() == runs:  # an FX/AOT cache hit: the pass did not run; the report re-derives the sites
        ours = patches["post_grad_custom_pre_pass"]
        ours = ours.first if isinstance(ours, ChainedPass) else ours
        rewrite.record_cache_hit(gm, example_inputs, eager=ours.eager)
    return compiled if guard is None else _guarded(compiled, guard)


def _guarded(compiled: Any, guard: Callable[[Any], None]) -> Any:
    """`compiled` behind a per-call `guard` of its inputs (`quantize_pass.calibration_guard`). Called as Dynamo
    calls `compiled`: with the inputs as arguments, or boxed (one list of them) where Dynamo passed the graph
    boxed; a graph's inputs are tensors and numbers, never one list, so the two cannot be confused."""

    def run(*args: Any) -> Any:
        guard(args[0] if len(args) == 1 and isinstance(args[0], list) else args)
        return compiled(*args)

    if getattr(compiled, "_boxed_call", False):
        run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _reset() -> None:
    """What Inductor's wrapper resets: the CUDA-graph trees (called by torch._dynamo.reset())."""
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
    except ImportError:  # pragma: no cover
        return
    reset_cudagraph_trees()


oasr_backend.reset = _reset  # type: ignore[attr-defined]
