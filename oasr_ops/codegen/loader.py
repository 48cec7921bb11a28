"""Loading a verified kernel library: dlopen only after the manifest check (cache_trust), the C ABI functions
typed once and wrapped so an integer argument that does not fit its C type raises ValueError (ctypes would
silently wrap it), one handle per path per process, a family's launcher (`load_launcher`) on top."""
from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable


from .cache_trust import LoadError, _check_dir, _verify, manifest_path
from .templates import ABI_VERSION


@dataclass
class KernelLibrary:
    """A loaded kernel `.so`: the C ABI functions with their argument types set once (wrapped so that an integer
    argument that does not fit its C type raises ValueError instead of wrapping)."""

    path: Path
    describe: str
    run: Callable[..., int] = field(repr=False)
    can_implement: Callable[..., int] = field(repr=False)
    workspace_size: Callable[..., int] = field(repr=False)
    handle: ctypes.CDLL | None = field(default=None, repr=False)



# ----------------------------------------------------------------------------------------------------------
# loading: verify, dlopen, typed and range-checked C functions

class _BadLibrary(LoadError):
    """A library that failed verification or loading; `digest` is its content hash (None: unreadable)."""

    def __init__(self, message: str, digest: str | None):
        super().__init__(message)
        self.digest = digest


_INT_CODES = frozenset("bBhHiIlLqQ")  # ctypes `_type_` codes of integer types = struct format codes


def checked(fn, argtypes: list, restype, names: list[str] | None = None) -> Callable[..., int]:
    """Set `fn`'s C signature and return a caller that rejects an integer argument outside its C type's range
    (ValueError naming it) instead of letting ctypes truncate it. One struct.pack checks them all: its format
    codes are ctypes' own, so the ranges are the C ones."""
    fn.argtypes, fn.restype = argtypes, restype
    idx = tuple(i for i, t in enumerate(argtypes) if getattr(t, "_type_", None) in _INT_CODES)
    if not idx:
        return fn
    fmt = "".join(argtypes[i]._type_ for i in idx)
    pack = struct.Struct("@" + fmt).pack
    # itemgetter of one index returns the item, of several a tuple
    take = itemgetter(*idx) if len(idx) > 1 else (lambda a, _i=idx[0]: (a[_i],))
    fname = getattr(fn, "__name__", "launcher")

    def call(*args):
        try:
            pack(*take(args))
        except struct.error:
            _raise_range(fname, args, idx, argtypes, names)
        except IndexError:
            pass  # a wrong argument count: ctypes says so
        return fn(*args)

    call.__name__ = fname
    return call


def _raise_range(fname: str, args: tuple, idx: tuple, argtypes: list, names: list[str] | None) -> None:
    for i in idx:
        t = argtypes[i]
        try:
            struct.pack("@" + t._type_, args[i])
        except struct.error:
            name = names[i] if names and i < len(names) else f"#{i}"
            bits = 8 * ctypes.sizeof(t)
            v = args[i]
            if not isinstance(v, int) and not hasattr(v, "__index__"):
                raise TypeError(f"{fname}: argument {name} must be an integer ({t.__name__}), got {v!r}") from None
            raise ValueError(f"{fname}: argument {name} = {v} does not fit the launcher's {bits}-bit "
                             f"{t.__name__} (ctypes would silently wrap it); split the call") from None


_load_lock = threading.Lock()
_loaded: dict[Path, KernelLibrary] = {}
_RUN_NAMES = ["a", "w", "bias", "out", "m", "n", "k", "split_k", "act", "workspace", "workspace_bytes", "stream"]
_SHAPE_NAMES = ["m", "n", "k", "split_k", "act"]


def _dlopen_verified(path: Path) -> tuple[ctypes.CDLL, str]:
    """dlopen `path` only if it matches its install manifest (hash checked here, right before the dlopen)."""
    if not path.parent.exists():
        raise _BadLibrary(f"{path} is missing", None)
    _check_dir(path.parent)  # UnsafeCacheError (a BuildError)
    why = _verify(path)
    if why is not None:
        raise _BadLibrary(f"{path} {why}", None)
    try:
        digest = manifest_path(path).read_text().split()[0]
    except (OSError, IndexError) as e:  # replaced under us since _verify
        raise _BadLibrary(f"{path}: manifest unreadable ({e})", None) from None
    try:
        return ctypes.CDLL(str(path)), digest
    except OSError as e:
        raise _BadLibrary(f"cannot load {path}: {e}", digest) from None


def _load(path: Path) -> KernelLibrary:
    """The generic (gemm) C ABI of a built kernel, cached per path; raises LoadError (_BadLibrary: rebuildable)."""
    with _load_lock:
        lib = _loaded.get(path)
        if lib is not None:
            return lib
        cdll, digest = _dlopen_verified(path)
        try:
            version = cdll.oasr_abi_version()
            if version != ABI_VERSION:
                raise _BadLibrary(f"{path} has launcher ABI {version}, this oasr_ops expects {ABI_VERSION}", digest)
            cdll.oasr_describe.restype = ctypes.c_char_p
            describe = cdll.oasr_describe().decode()
            i = ctypes.c_int
            run = checked(cdll.oasr_run, [ctypes.c_void_p] * 4 + [i] * 5 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                           ctypes.c_void_p], i, _RUN_NAMES)
            can = checked(cdll.oasr_can_implement, [i] * 5, i, _SHAPE_NAMES)
            ws = checked(cdll.oasr_workspace_size, [i] * 5, ctypes.c_size_t, _SHAPE_NAMES)
        except (AttributeError, _BadLibrary) as e:
            _dlclose(cdll)  # so that a rebuilt file at this path is really loaded, not this handle again
            if isinstance(e, _BadLibrary):
                raise
            raise _BadLibrary(f"{path} does not export the oasr C ABI: {e}", digest) from None
        lib = KernelLibrary(path, describe, run, can, ws, cdll)
        _loaded[path] = lib
        return lib


def _dlclose(cdll: ctypes.CDLL) -> None:
    try:
        import _ctypes

        _ctypes.dlclose(cdll._handle)
    except (ImportError, AttributeError, OSError):
        pass


def load_launcher(spec: Any, prefix: str, abi_version: int, run_args: list, shape_args: list,
                  run_names: list[str] | None = None, shape_names: list[str] | None = None) -> KernelLibrary:
    """A kernel family's own launcher in a built kernel: ``oasr_<prefix>_{run,can_implement,workspace_size}``
    (argument types `run_args` / `shape_args`, optional names for error messages) and
    ``oasr_<prefix>_abi_version`` == `abi_version`, on top of `spec.load()` (which builds if needed, verifies
    and checks the shared ABI). Integer arguments are range-checked per call (`checked`).
    Raises BuildError / LoadError."""
    generic = spec.load()
    cdll = generic.handle  # the verified handle: never dlopen the path again (it could have been replaced)
    try:
        version = getattr(cdll, f"oasr_{prefix}_abi_version")()
        if version != abi_version:
            raise LoadError(f"{generic.path} has {prefix} launcher ABI {version}, expected {abi_version}")
        fns = {}
        for name, args, restype, names in (("run", run_args, ctypes.c_int, run_names),
                                           ("can_implement", shape_args, ctypes.c_int, shape_names),
                                           ("workspace_size", shape_args, ctypes.c_size_t, shape_names)):
            fns[name] = checked(getattr(cdll, f"oasr_{prefix}_{name}"), args, restype, names)
    except AttributeError as e:
        raise LoadError(f"{generic.path} does not export the {prefix} C ABI: {e}") from None
    return KernelLibrary(generic.path, generic.describe, fns["run"], fns["can_implement"], fns["workspace_size"],
                         cdll)


