"""Do two built kernel libraries carry the same device code? Exit 0 if so, 1 if not, 2 on bad input.

    python scripts/same_device_code.py OLD.so NEW.so [OLD2.so NEW2.so ...]

Why: a shipped tuning file is stamped with its lane's `impl` hash (the rendered kernel sources). When a source change
cannot affect a measured kernel (e.g. a helper template the kernel never instantiates), the entries' timings still
describe today's kernels; this is the evidence for re-stamping instead of re-measuring (docs/tuning.md, "Stale
shipped entries"). No GPU and no cuobjdump needed: the `.nv_fatbin` sections (`objcopy --dump-section`) are
compared byte for byte after one normalisation — nvcc names internal-linkage symbols `_INTERNAL_<8 hex>_...` (and anonymous namespaces
`_GLOBAL__N__<8 hex>_...`) with a hash of the translation unit, which any source edit changes; every occurrence of
each side's hash is replaced by one placeholder.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

_TU_HASH = re.compile(rb"_INTERNAL_([0-9a-f]{8})_")


def fatbin(path: Path) -> bytes:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "fatbin"
        # --dump-section into a scratch copy: objcopy would otherwise rewrite its input
        r = subprocess.run(["objcopy", "--dump-section", f".nv_fatbin={dump}", str(path), str(Path(tmp) / "copy")],
                           capture_output=True, text=True)
        if r.returncode != 0 or not dump.is_file():
            raise ValueError(f"{path}: no .nv_fatbin section (not a CUDA kernel library?) {r.stderr.strip()}")
        return dump.read_bytes()


def same_device_code(old: Path, new: Path) -> tuple[bool, str]:
    a, b = fatbin(old), fatbin(new)
    if len(a) != len(b):
        return False, f"fatbin sizes differ ({len(a)} vs {len(b)} bytes)"
    na, nb = _normalised(a), _normalised(b)
    if na != nb:
        return False, f"{sum(x != y for x, y in zip(na, nb))} bytes differ after normalising the TU hash"
    return True, f"identical ({len(a)} bytes; {a.count(_tu_hash(a) or b'-')} TU-hash occurrences normalised)"


def _tu_hash(blob: bytes) -> bytes | None:
    hashes = set(_TU_HASH.findall(blob))
    if len(hashes) > 1:
        raise ValueError(f"more than one translation-unit hash in one library: {sorted(hashes)}")
    return next(iter(hashes), None)


def _normalised(blob: bytes) -> bytes:
    h = _tu_hash(blob)
    return blob.replace(h, b"xxxxxxxx") if h else blob


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    ok = True
    for old, new in zip(argv[::2], argv[1::2]):
        try:
            same, why = same_device_code(Path(old), Path(new))
        except (OSError, ValueError, subprocess.CalledProcessError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{'SAME' if same else 'DIFFERENT'}  {Path(old).name}  {Path(new).name}: {why}")
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
