"""`oasr tune census` on the command line: argument parsing and validation of every input (a `UsageError`
before the model is built or a file written, see `oasr_ops.errors`); the census itself is
`oasr_ops.tune.census` (its module docstring is the design: graph keys, traffic, output format)."""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..paths import write_text_atomic
from .census import (DEFAULT_MAX_KEYS, DEFAULT_STEPS, DEFAULT_TIME_GRANULARITY, CensusInputError, census_for_model,
                     merge_capture, read_manifest)
from .census_model import _parse_model_args, build_for_census, coerce_model_args, load_builder

log = logging.getLogger("oasr_ops.tune.census")

# Offline time buckets a census may span (--max-seconds or the manifest's longest utterance over
# --time-granularity): far above any real deployment (64-frame buckets of 10 ms frames: 17 hours), and a bound
# on the key list a typo (1e9 seconds) would otherwise build before --max-keys trims it.
MAX_TIME_BUCKETS = 100_000


def _positive(kind: type) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not 0 < v < math.inf:  # NaN and infinity too: a number of seconds or streams is finite
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
        return v
    conv.__name__ = f"positive {kind.__name__}"
    return conv


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "census", help="trace a model's graph keys on FakeTensors: GEMM points + traffic weights (no GPU)",
        description="Trace a model's graph keys on FakeTensors (no GPU) and write the GEMM points each key "
                    "reaches, weighted by traffic, as a census JSON for `oasr tune build`. The design (graph "
                    "keys, traffic, output format) is in docs/tuning.md and oasr_ops/tune/census.py.")
    pos_int, pos_float = _positive(int), _positive(float)
    p.add_argument("--model", required=True, help="module:function building the model, e.g. "
                   "examples.conformer:build_model (the module is imported from the current directory too)")
    p.add_argument("--model-args", nargs="*", default=[], metavar="K=V",
                   help="builder keyword arguments: typed by the builder's default where it is a bool, int, float or "
                   "torch.dtype (unless its annotation admits str), else passed as strings (default: none)")
    from ..families.quantization import schemes

    p.add_argument("--quantization", choices=sorted(schemes()), default=None,
                   help="quantize the full-precision model online (oasr_ops.quantize_) before tracing: the census "
                        "then reports its scaled_mm sites (default: none; a model already quantized needs none)")
    p.add_argument("--calibrated", action="store_true",
                   help="with --quantization: the deployment calibrates (oasr_ops.calibrate) and compiles with the "
                        "quantization fusion (backend=\"oasr\"'s default), so each FFN fc1 -> GELU/SiLU -> fc2 runs "
                        "fc1 as the act-quant GEMM: its points are recorded under the op that GEMM's tile is read "
                        "from (scaled_mm_quant / scaled_mm_fp8_quant; oasr_ops/tune/census_fused.py)")
    p.add_argument("--service-mode", choices=("offline", "streaming"), required=True,
                   help="offline: (batch, time) buckets over a manifest; streaming: cohort widths x one chunk")
    p.add_argument("--max-batch-size", type=pos_int, required=True, help="largest batch (offline) or cohort "
                   "width (streaming) the deployment captures")
    p.add_argument("--manifest", help="offline: JSON lines with a 'duration' (s) per utterance (traffic weights)")
    p.add_argument("--time-granularity", type=pos_int, default=DEFAULT_TIME_GRANULARITY,
                   help="offline time bucket, input frames")
    p.add_argument("--max-seconds", type=pos_float,
                   help="offline: top time bucket (default: the manifest's longest utterance)")
    p.add_argument("--chunk-size", type=pos_int, default=16, help="streaming: encoder frames per chunk")
    p.add_argument("--chunk-frames", type=pos_int,
                   help="streaming: input frames per chunk (default: from --chunk-size and the subsampling)")
    p.add_argument("--concurrency", help="streaming: JSON file {width: weight} (default: Poisson, mean max/4)")
    p.add_argument("--concurrency-mean", type=pos_float,
                   help="streaming: mean of the default Poisson histogram (default: max batch size / 4)")
    p.add_argument("--steps", type=pos_int, default=DEFAULT_STEPS,
                   help="streaming: decode steps the histogram is scaled to")
    p.add_argument("--max-keys", type=pos_int, default=DEFAULT_MAX_KEYS,
                   help="bound on traced keys (traffic-bearing keys first)")
    p.add_argument("--n-mels", type=pos_int, help="override the model's census_info['n_mels'] (default: 80)")
    p.add_argument("--input-layout", choices=("BTF", "BFT"),
                   help="override census_info['input_layout'] (default: BTF)")
    p.add_argument("--fixed-window", type=pos_int,
                   help="override census_info['fixed_window'] (input frames; default: none, time is bucketed)")
    p.add_argument("--capture", action="append", default=[],
                   help="merge an OASR_CAPTURE_GEMM recording (repeatable; default: none)")
    p.add_argument("--out", required=True, help="census JSON to write (its directory must exist)")
    p.set_defaults(func=main)


def _one_line(e: BaseException) -> str:
    """An exception of the user's code as ``Type: message`` on one line (the CLI's error is one line)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def _same_file(a: Path, b: str | os.PathLike[str]) -> bool:
    try:
        return a.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _refuse_overwriting_inputs(out: Path, inputs: list[tuple[str, str | os.PathLike[str] | None]]) -> None:
    """UsageError when --out is (a link to) one of the files the census reads: the atomic write would replace
    the manifest, capture or model source with the census."""
    from ..errors import UsageError

    for what, path in inputs:
        if path and _same_file(out, path):
            raise UsageError(f"--out {out}: is the {what} file {path}; write the census elsewhere")


def _concurrency(doc: Any, path: str, max_batch_size: int) -> dict[int, float]:
    """The --concurrency histogram, checked: widths in 1..--max-batch-size (a width above it gets no key, so its
    weight would vanish and the rest be rescaled), weights finite numbers >= 0, not all zero."""
    from ..errors import UsageError

    where = f"--concurrency {path}"
    if not isinstance(doc, dict) or not doc:
        raise UsageError(f"{where}: expected {{width: weight}}")
    hist: dict[int, float] = {}
    for k, v in doc.items():
        try:
            w = int(k)
        except ValueError:
            raise UsageError(f"{where}: width {k!r} is not an integer") from None
        if not 1 <= w <= max_batch_size:
            raise UsageError(f"{where}: width {k} is not in 1..{max_batch_size} (--max-batch-size)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise UsageError(f"{where}: width {k}: weight must be a finite number >= 0, got {json.dumps(v)[:40]}")
        hist[w] = hist.get(w, 0.0) + float(v)
    if not any(v > 0 for v in hist.values()):
        raise UsageError(f"{where}: every weight is 0 (no traffic to spread over the widths)")
    return hist


def _load_model_for_cli(spec: str, model_args: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    """`load_builder` with every failure a UsageError naming --model; the arguments are checked against the
    builder's signature before anything is built."""
    from ..errors import UsageError

    mod_name, sep, fn_name = spec.partition(":")
    if not sep or not mod_name or not fn_name:
        raise UsageError(f"--model expects module:function, got {spec!r}")
    try:
        builder, mod = load_builder(spec)
    except ModuleNotFoundError as e:
        raise UsageError(f"--model {spec}: cannot import {e.name or mod_name!r} ({e})") from None
    except AttributeError:
        raise UsageError(f"--model {spec}: module {mod_name!r} has no {fn_name!r}") from None
    except ImportError as e:
        raise UsageError(f"--model {spec}: cannot import {mod_name!r} ({e})") from None
    except ValueError as e:  # load_builder's own checks (cannot import, no such function or file, the module
        # raised while imported): they name --model; the module's own traceback under -v
        if e.__cause__ is not None:
            log.debug("importing --model %s failed:", spec, exc_info=e.__cause__)
        raise UsageError(" ".join(str(e).split())) from None
    if not callable(builder):
        raise UsageError(f"--model {spec}: {fn_name!r} is not callable")
    try:
        inspect.signature(builder).bind(**model_args)
    except TypeError as e:
        raise UsageError(f"--model-args do not fit {spec}: {e}") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    return builder, mod


def main(args: argparse.Namespace) -> int:
    """`oasr tune census`: every input is checked (UsageError) before the model is built or a file written."""
    import torch

    from ..errors import UsageError, existing_file, json_file, writable_output
    from .capture_file import check_capture

    t0 = time.perf_counter()
    if args.calibrated and not args.quantization:
        raise UsageError("--calibrated describes a quantized deployment: give --quantization too (the pairs are "
                         "found on the full-precision model before it is quantized)")
    try:
        model_args = _parse_model_args(args.model_args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = writable_output(args.out, "--out")
    model_file = args.model.rpartition(":")[0]
    _refuse_overwriting_inputs(out, [("--manifest", args.manifest), ("--concurrency", args.concurrency),
                                     *(("--capture", c) for c in args.capture),
                                     ("--model", model_file if model_file.endswith(".py") else None)])
    durations = None
    if args.manifest:
        existing_file(args.manifest, "--manifest")
        try:
            durations = read_manifest(args.manifest)
        except UnicodeDecodeError:
            raise UsageError(f"--manifest {args.manifest}: not UTF-8 text") from None
        except ValueError as e:  # names the file and line
            raise UsageError(f"--manifest {e}") from None
        if not durations:
            raise UsageError(f"--manifest {args.manifest}: no utterances")
    hist = None
    if args.concurrency:
        hist = _concurrency(json_file(args.concurrency, "--concurrency"), args.concurrency, args.max_batch_size)
    for cap in args.capture:  # every record checked now: a bad one must not cost a trace, then a refused census
        existing_file(cap, "--capture")
        try:
            check_capture(cap)
        except ValueError as e:
            raise UsageError(f"--capture {e}") from None
    builder, mod = _load_model_for_cli(args.model, model_args)
    try:
        typed_args = coerce_model_args(builder, model_args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    _refuse_overwriting_inputs(out, [("--model", getattr(mod, "__file__", None))])
    info = dict(getattr(mod, "census_info", {}) or {})
    for k, v in (("n_mels", args.n_mels), ("input_layout", args.input_layout), ("fixed_window", args.fixed_window)):
        if v is not None:
            info[k] = v
    if args.service_mode == "offline" and durations is None and not info.get("fixed_window") \
            and args.max_seconds is None:
        raise UsageError("offline needs --manifest (or --max-seconds, with no traffic weights)")
    if args.service_mode == "offline" and not info.get("fixed_window"):
        top_s = args.max_seconds or max(durations or [0.0])
        buckets = top_s * 1000.0 / float(info.get("frame_shift_ms", 10)) / args.time_granularity
        if buckets > MAX_TIME_BUCKETS:
            source = "--max-seconds" if args.max_seconds else f"--manifest {args.manifest}'s longest utterance"
            raise UsageError(f"{source}: {top_s:g} s makes {buckets:.3g} time buckets of --time-granularity "
                             f"{args.time_granularity} frames (at most {MAX_TIME_BUCKETS})")
    log.debug("building %s%s", args.model, f" with {model_args}" if model_args else "")
    try:
        model = build_for_census(builder, typed_args)
    except TypeError as e:  # a builder taking **kwargs rejects unknown --model-args itself
        raise UsageError(f"--model-args do not fit {args.model}: {e}") from None
    except Exception as e:  # the user's builder failed: its message, its traceback under -v
        log.debug("the builder of --model %s raised:", args.model, exc_info=True)
        raise UsageError(f"--model {args.model}: {_one_line(e)}") from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"--model {args.model}: the builder returned {type(model).__name__}, not a torch.nn.Module")
    pairs = None
    if args.calibrated:  # found on the full-precision model, before quantize_ replaces its Linears
        from .census import input_maker
        from .census_fused import act_quant_pairs

        try:
            pairs = act_quant_pairs(model, input_maker(model, info)[0], info.get("fixed_window"))
        except Exception as e:  # the model's forward on a meta input: its message, its traceback under -v
            log.debug("tracing --model %s for its fc1 -> activation -> fc2 pairs raised:", args.model, exc_info=True)
            raise UsageError(f"--calibrated: --model {args.model} could not be traced on the meta device for its "
                             f"fc1 -> GELU/SiLU -> fc2 pairs: {_one_line(e)}") from None
        if not pairs:
            log.warning("--calibrated: --model %s has no Linear -> GELU/SiLU -> Linear, so no site runs the "
                        "act-quant GEMM: the census is the one --quantization alone writes", args.model)
    if args.quantization:  # a full-precision model quantized online, as the deployment will run it
        from ..families.quantization import quantize

        model = quantize(model, args.quantization, who="oasr tune census --quantization")
    from ..families.self_attention import fast_path_layers

    fast = fast_path_layers(model)
    if fast:  # their GEMMs are censused, but a compiled eval model under no_grad serves them in one native op each
        log.warning("--model %s: %d nn.TransformerEncoderLayer(s) (%s%s) meet PyTorch's fused fast-path conditions: "
                    "served in eval under torch.no_grad() each is one native op and backend=\"oasr\" serves none "
                    "of its GEMMs, so their points in this census would be tuned for nothing. They are served after "
                    "torch.backends.mha.set_fastpath_enabled(False), or quantized (--quantization)",
                    args.model, len(fast), ", ".join(fast[:3]), ", ..." if len(fast) > 3 else "")
    try:
        c = census_for_model(model, info, service_mode=args.service_mode, max_batch_size=args.max_batch_size,
                             durations=durations, time_granularity=args.time_granularity,
                             max_seconds=args.max_seconds, chunk_size=args.chunk_size,
                             chunk_frames=args.chunk_frames, concurrency=hist,
                             concurrency_mean=args.concurrency_mean, steps=args.steps, max_keys=args.max_keys,
                             progress=True, act_quant_pairs=pairs)
    except CensusInputError as e:
        log.debug("the model's forward on the census input raised:", exc_info=True)
        raise UsageError(f"--model {args.model}: {e}: {_one_line(e.__cause__)} (--n-mels, --input-layout and "
                         "--fixed-window shape the input; the model's census_info sets their defaults)") from None
    for cap in args.capture:
        merge_capture(c, cap)
    c.info.update({"model": args.model, "model_args": model_args, "census_info": info, "fast_path_layers": fast,
                   "quantization": args.quantization, "calibrated": args.calibrated,
                   "act_quant_pairs": pairs,
                   "manifest": args.manifest, "captures": list(args.capture)})
    doc = c.to_json()
    # atomic: a census others build from, or the one this run replaces, is never left torn by a crash
    write_text_atomic(out, json.dumps(doc, indent=1, sort_keys=False))
    npts = sum(len(s["points"]) for s in doc["signatures"].values())
    if not doc["signatures"]:  # written all the same (the truth about this model), but `oasr tune build` has nothing
        log.warning("--model %s: no site the backend rewrites was traced; the census is empty", args.model)
    print(f"census: {len(doc['keys'])} key(s), {len(doc['signatures'])} signature(s), {npts} point(s), "
          f"{c.info['traces']} trace(s) in {time.perf_counter() - t0:.1f}s -> {args.out}")
    return 0
