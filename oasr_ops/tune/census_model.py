"""`oasr tune census --model`: the user's builder loaded (`module:function` or `path/to/file.py:function`), its
`--model-args` typed, the model built for tracing (on the meta device where the builder takes ``device``). Every
failure of the user's code is a ValueError naming --model (the CLI turns it into one line)."""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable


def _parse_model_args(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise ValueError(f"--model-args expects key=value, got {it!r}")
        out[k] = v
    return out


def load_builder(spec: str) -> tuple[Callable[..., Any], Any]:
    """`--model`: `package.module:function` or `path/to/file.py:function` -> (the function, its module).

    A file inside a package folder (its folder has __init__.py, like examples/conformer.py, which imports
    `._common`) is imported under its dotted name. Folders are APPENDED to sys.path, never put first: a checkout
    beside the current directory must not shadow the installed oasr_ops.
    """
    target, sep, fn_name = spec.rpartition(":")
    if not sep or not target or not fn_name:
        raise ValueError(f"--model expects module:function or path/to/file.py:function, got {spec!r}")
    if target.endswith(".py") or "/" in target or os.sep in target:
        mod = _import_file(Path(target), spec)
    else:
        if os.getcwd() not in sys.path:  # a module under the current directory, as `python -m` would find it
            sys.path.append(os.getcwd())
        try:
            mod = _import_module(target, spec)
        except ImportError as e:
            raise ValueError(f"--model {spec!r}: cannot import {target!r} ({e}); give a module importable from "
                             "here or a file path such as examples/conformer.py:build_model") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"--model {spec!r}: {mod.__name__} has no function {fn_name!r}")
    return fn, mod


def _import_module(name: str, spec: str) -> Any:
    """importlib.import_module(name). What the module's own code raises while it is imported (a SyntaxError, an
    exception at its top level) is the user's code failing, not ours: ValueError naming --model and the
    exception, chained to it (the CLI shows the traceback under -v). ImportError propagates as it is."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise
    except Exception as e:
        raise ValueError(f"--model {spec}: {type(e).__name__}: {e} (importing {name})") from e


def _import_file(path: Path, spec: str = "") -> Any:
    path = path.expanduser().resolve()
    if not path.is_file() or path.suffix != ".py":
        raise ValueError(f"--model: no Python file {path}")
    parts, root = [path.stem], path.parent
    while (root / "__init__.py").is_file():  # climb to the top package: relative imports need it
        parts.insert(0, root.name)
        root = root.parent
    if str(root) not in sys.path:
        sys.path.append(str(root))
    name = ".".join(parts)
    mod = _import_module(name, spec or str(path))
    if Path(mod.__file__ or "").resolve() != path:
        raise ValueError(f"--model: {name} resolves to {mod.__file__}, not {path} (another package named "
                         f"{parts[0]!r} comes first on sys.path)")
    return mod


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def coerce_model_args(builder: Callable[..., Any], args: dict[str, str]) -> dict[str, Any]:
    """`--model-args` strings typed by the builder's defaults: a parameter whose default is a bool, int, float or
    torch.dtype (and whose annotation does not also admit ``str``: such a builder parses its own strings, as the
    examples do) gets that type; anything else stays a string. ValueError names the argument and the type."""
    import torch

    short = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}  # the rest: torch's own names
    try:
        params = inspect.signature(builder).parameters
    except ValueError:  # a builtin without a signature
        return dict(args)
    out: dict[str, Any] = {}
    for k, v in args.items():
        p = params.get(k)
        default = None if p is None else p.default
        ann = "" if p is None or p.annotation is inspect.Parameter.empty else str(p.annotation)
        if default is None or default is inspect.Parameter.empty or isinstance(default, str) \
                or re.search(r"\bstr\b", ann):
            out[k] = v
        elif isinstance(default, bool):
            if v.lower() not in _TRUE + _FALSE:
                raise ValueError(f"--model-args {k}={v!r}: not a bool (true/false, 1/0)")
            out[k] = v.lower() in _TRUE
        elif isinstance(default, (int, float)):
            try:
                out[k] = type(default)(v)
            except ValueError:
                raise ValueError(f"--model-args {k}={v!r}: not {type(default).__name__} (the builder's default is "
                                 f"{default!r})") from None
        elif isinstance(default, torch.dtype):
            name = v.lower().removeprefix("torch.")
            dt = getattr(torch, short.get(name, name), None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"--model-args {k}={v!r}: not a dtype (fp16, bf16, fp32 or a torch dtype name)")
            out[k] = dt
        else:
            out[k] = v
    return out


def build_for_census(builder: Callable[..., Any], args: dict[str, Any]) -> Any:
    """Build the model, on the meta device when the builder takes ``device`` and none was given."""
    params = inspect.signature(builder).parameters
    kw = dict(args)
    if "device" in params and "device" not in kw:
        kw["device"] = "meta"
    return builder(**kw)
