"""ArchProfile: the device numbers the cost model needs, from a static table or a cached micro-benchmark.

* `STATIC_PROFILES` — known SKUs from public spec sheets (dense tensor throughput, no sparsity), so a CPU
  machine (a compile server, CI) can model a target GPU. Fields a spec sheet does not give (L2 bandwidth,
  launch costs) are typical measured values, marked `~` in the comments; a probe on the device supersedes them.
* `reference_profile(arch_family)` — the family's reference SKU (sm80 A100, sm89 L40S, sm90 H200, sm100 B200,
  sm120 RTX 5090).
* `probe_profile(device)` — GPU only: device properties + micro-benchmarks (DRAM and L2 bandwidth by large and
  L2-resident copies, dense fp16/bf16/int8/fp8 matmul throughput at 8192^3, per-kernel cost inside a CUDA graph
  and eagerly), cached as JSON per (sku, driver, torch version) under `paths.cache_root()/arch_profile/`.
* `current_profile(arch_family=None)` — the cached probe where a GPU is present, else the static reference.

Importing this module neither imports torch nor initialises CUDA.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import paths
from .arch import normalize_arch

DTYPES = ("fp16", "bf16", "int8", "fp8")
PROFILE_SCHEMA = 1


@dataclass(frozen=True)
class ArchProfile:
    sku: str
    arch_family: str  # "sm90"
    sm_count: int
    smem_per_sm_bytes: int
    l2_bytes: int
    sm_clock_mhz: float
    dram_bw_bytes_s: float
    # dense tensor throughput (ops/s: one multiply-add = 2 ops) per operand dtype; 0 = not supported
    peak_ops_s: dict[str, float] = field(default_factory=dict)
    graph_launch_s: float = 2.0e-6  # cost of one tiny kernel inside a CUDA graph (launch + minimal kernel)
    eager_launch_s: float = 5.0e-6  # host issue cost of one eager launch
    # Aggregate L2 -> SM bandwidth. It bounds a CTA's operand feed: a lone CTA streams its tiles at about
    # l2_bw / sm_count (the H200 build log: 80-110 GB/s per CTA for 64x32 .. 128x256 tiles at M=8, K=19456).
    l2_bw_bytes_s: float = 0.0  # 0 = unknown: 2.5 x DRAM bandwidth
    source: str = "static"  # "static" | "probe"

    def __hash__(self) -> int:  # the dict field makes the generated hash fail; profiles key memo tables
        return hash((self.sku, self.arch_family, self.sm_count, self.dram_bw_bytes_s,
                     tuple(sorted(self.peak_ops_s.items())), self.graph_launch_s, self.l2_bw_bytes_s))

    def peak(self, dtype: str) -> float:
        """Dense ops/s for an operand dtype ("fp16", "bf16", "int8", "fp8"; "half" = fp16). ValueError when the
        SKU has no such tensor path."""
        d = normalize_dtype(dtype)
        v = float(self.peak_ops_s.get(d, 0.0))
        if v <= 0:
            raise ValueError(f"{self.sku} has no dense {d} tensor throughput in its profile")
        return v

    @property
    def l2_bw(self) -> float:
        return self.l2_bw_bytes_s if self.l2_bw_bytes_s > 0 else 2.5 * self.dram_bw_bytes_s

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROFILE_SCHEMA, **asdict(self)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ArchProfile":
        try:
            p = ArchProfile(
                sku=str(d["sku"]), arch_family=str(d["arch_family"]), sm_count=int(d["sm_count"]),
                smem_per_sm_bytes=int(d["smem_per_sm_bytes"]), l2_bytes=int(d["l2_bytes"]),
                sm_clock_mhz=float(d["sm_clock_mhz"]), dram_bw_bytes_s=float(d["dram_bw_bytes_s"]),
                peak_ops_s={str(k): float(v) for k, v in dict(d.get("peak_ops_s", {})).items()},
                graph_launch_s=float(d.get("graph_launch_s", 2.0e-6)),
                eager_launch_s=float(d.get("eager_launch_s", 5.0e-6)),
                l2_bw_bytes_s=float(d.get("l2_bw_bytes_s", 0.0)), source=str(d.get("source", "static")))
        except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: int(Infinity)
            raise ValueError(f"malformed ArchProfile {str(d)[:200]!r}: {e}") from None
        # every quantity the cost model divides by or scales with: positive and finite (a cached file is data)
        positive = {"sm_count": p.sm_count, "smem_per_sm_bytes": p.smem_per_sm_bytes, "l2_bytes": p.l2_bytes,
                    "sm_clock_mhz": p.sm_clock_mhz, "dram_bw_bytes_s": p.dram_bw_bytes_s,
                    "graph_launch_s": p.graph_launch_s, "eager_launch_s": p.eager_launch_s}
        # 0 allowed where it means "none": a dtype the GPU has no tensor-core path for, an unprobed L2 bandwidth
        non_negative = {"l2_bw_bytes_s": p.l2_bw_bytes_s, **{f"peak_ops_s[{k}]": v for k, v in p.peak_ops_s.items()}}
        bad = [k for k, v in positive.items() if not 0 < v < math.inf]
        bad += [k for k, v in non_negative.items() if not 0 <= v < math.inf]
        if bad:
            raise ValueError(f"malformed ArchProfile {str(d)[:200]!r}: {', '.join(bad)} out of range (NaN, "
                             "infinite or negative)")
        return p


def normalize_dtype(dtype: Any) -> str:
    """"fp16"/"half"/"float16"/torch.float16 -> "fp16"; likewise bf16, int8, fp8 (e4m3/e5m2)."""
    s = str(dtype).lower().replace("torch.", "")
    table = {"fp16": "fp16", "half": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16",
             "int8": "int8", "fp8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8"}
    if s not in table:
        raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    return table[s]


_KB, _MB = 1024, 1024 * 1024
_T = 1e12

# Public spec sheets (NVIDIA datasheets / whitepapers), dense throughput. `~`: not on a spec sheet (typical
# microbenchmark values); the probe replaces them on the device.
STATIC_PROFILES: dict[str, ArchProfile] = {p.sku: p for p in (
    ArchProfile("NVIDIA A100-SXM4-80GB", "sm80", sm_count=108, smem_per_sm_bytes=164 * _KB, l2_bytes=40 * _MB,
                sm_clock_mhz=1410, dram_bw_bytes_s=2.039e12,
                peak_ops_s={"fp16": 312 * _T, "bf16": 312 * _T, "int8": 624 * _T, "fp8": 0.0},
                graph_launch_s=2.0e-6, eager_launch_s=5.0e-6, l2_bw_bytes_s=5.5e12),  # ~L2
    ArchProfile("NVIDIA L40S", "sm89", sm_count=142, smem_per_sm_bytes=100 * _KB, l2_bytes=96 * _MB,
                sm_clock_mhz=2520, dram_bw_bytes_s=0.864e12,
                peak_ops_s={"fp16": 362 * _T, "bf16": 362 * _T, "int8": 733 * _T, "fp8": 733 * _T},
                graph_launch_s=2.0e-6, eager_launch_s=5.0e-6, l2_bw_bytes_s=4.0e12),  # ~L2
    ArchProfile("NVIDIA H100 80GB HBM3", "sm90", sm_count=132, smem_per_sm_bytes=228 * _KB, l2_bytes=50 * _MB,
                sm_clock_mhz=1980, dram_bw_bytes_s=3.35e12,
                peak_ops_s={"fp16": 989 * _T, "bf16": 989 * _T, "int8": 1979 * _T, "fp8": 1979 * _T},
                graph_launch_s=2.0e-6, eager_launch_s=5.0e-6, l2_bw_bytes_s=12.0e12),  # ~L2
    # H200: 141 GB HBM3e at 4.8 TB/s, the H100's SXM5 die. ~graph launch: the torch arm's floor in the H200
    # build log is 2.6 us (M=8, N=K=256); ~L2: 132 SMs x ~91 GB/s per lone CTA (same log).
    ArchProfile("NVIDIA H200", "sm90", sm_count=132, smem_per_sm_bytes=228 * _KB, l2_bytes=50 * _MB,
                sm_clock_mhz=1980, dram_bw_bytes_s=4.8e12,
                peak_ops_s={"fp16": 989 * _T, "bf16": 989 * _T, "int8": 1979 * _T, "fp8": 1979 * _T},
                graph_launch_s=2.0e-6, eager_launch_s=5.0e-6, l2_bw_bytes_s=12.0e12),
    ArchProfile("NVIDIA B200", "sm100", sm_count=148, smem_per_sm_bytes=228 * _KB, l2_bytes=126 * _MB,
                sm_clock_mhz=1965, dram_bw_bytes_s=8.0e12,
                peak_ops_s={"fp16": 2250 * _T, "bf16": 2250 * _T, "int8": 4500 * _T, "fp8": 4500 * _T},
                graph_launch_s=2.0e-6, eager_launch_s=5.0e-6, l2_bw_bytes_s=20.0e12),  # ~L2
    # RTX 5090: GeForce fp16/bf16 tensor throughput with fp32 accumulate (what the kernels use) is half the
    # fp16-accumulate figure.
    ArchProfile("NVIDIA GeForce RTX 5090", "sm120", sm_count=170, smem_per_sm_bytes=128 * _KB, l2_bytes=96 * _MB,
                sm_clock_mhz=2407, dram_bw_bytes_s=1.792e12,
                peak_ops_s={"fp16": 209.5 * _T, "bf16": 209.5 * _T, "int8": 838 * _T, "fp8": 419 * _T},
                graph_launch_s=2.0e-6, eager_launch_s=5.0e-6, l2_bw_bytes_s=7.0e12),  # ~L2
)}

REFERENCE_SKU = {"sm80": "NVIDIA A100-SXM4-80GB", "sm89": "NVIDIA L40S", "sm90": "NVIDIA H200",
                 "sm100": "NVIDIA B200", "sm120": "NVIDIA GeForce RTX 5090"}


def reference_profile(arch_family: str) -> ArchProfile:
    """The static profile of the family's reference SKU. ValueError for a family without one."""
    a = normalize_arch(arch_family)
    if a not in REFERENCE_SKU:
        raise ValueError(f"no reference SKU for {a} (known: {', '.join(sorted(REFERENCE_SKU))})")
    return STATIC_PROFILES[REFERENCE_SKU[a]]


def static_profile(sku: str) -> ArchProfile | None:
    """A static profile by device name; a name that contains a table SKU's distinctive part also matches
    ("NVIDIA H200 NVL" -> H200). None when the SKU is not in the table."""
    if sku in STATIC_PROFILES:
        return STATIC_PROFILES[sku]
    low = sku.lower()
    for key in ("h200", "h100", "a100", "l40s", "b200", "rtx 5090"):
        if key in low:
            return next(p for k, p in STATIC_PROFILES.items() if key in k.lower())
    return None


# ------------------------------------------------------------------------------------------------ probing

def _driver_version() -> str:
    """The CUDA driver version via libcuda (cuDriverGetVersion), "unknown" where it cannot be read."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    return "unknown"


def _cache_path(sku: str, driver: str, torch_version: str) -> Path:
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{sku}__drv{driver}__torch{torch_version}")
    return paths.cache_root() / "arch_profile" / f"{key}.json"


def write_cached(path: Path, profile: ArchProfile) -> None:
    """Atomic write under a file lock: a temp file in the same directory, fsync, os.replace. A concurrent
    reader sees the old file or the new one, never a torn one."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=60):
        paths.write_text_atomic(path, json.dumps(profile.to_dict(), indent=1, sort_keys=True))


def read_cached(path: Path) -> ArchProfile | None:
    """The cached profile, or None when absent, unreadable or of another schema (it is re-probed)."""
    try:
        d = json.loads(path.read_text())
        if d.get("schema") != PROFILE_SCHEMA:
            return None
        return ArchProfile.from_dict(d)
    except (OSError, ValueError, AttributeError, RecursionError):  # ValueError: not UTF-8 / JSON, or malformed
        return None


def _time_s(fn, iters: int) -> float:
    """Best-of-3 mean seconds per call of `fn` (CUDA events; one warm-up)."""
    import torch

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) * 1e-3 / iters)
    return best


def _bench_matmul(dtype: str, n: int = 8192) -> float:
    """Dense ops/s of the vendor GEMM at n^3; 0.0 where this device/torch has no such path."""
    import torch

    dev = "cuda"
    try:
        if dtype in ("fp16", "bf16"):
            dt = torch.float16 if dtype == "fp16" else torch.bfloat16
            a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
            fn = lambda: torch.mm(a, b)  # noqa: E731
        elif dtype == "int8":
            a = torch.randint(-8, 8, (n, n), device=dev, dtype=torch.int8)
            b = torch.randint(-8, 8, (n, n), device=dev, dtype=torch.int8).t()  # column-major B for cuBLASLt
            fn = lambda: torch._int_mm(a, b)  # noqa: E731
        else:
            a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            fn = lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.float16)  # noqa: E731
        t = _time_s(fn, 10)
    except (RuntimeError, TypeError, AttributeError):
        return 0.0
    return 2.0 * n ** 3 / t


def _bench_copy_bw(nbytes: int, iters: int) -> float:
    """Bytes/s of a device copy (read + write) of `nbytes`."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    t = _time_s(lambda: dst.copy_(src), iters)
    return 2.0 * nbytes / t


def _bench_launch(n: int = 200) -> tuple[float, float]:
    """(graph, eager) seconds per tiny kernel: a CUDA graph of n one-element adds replayed, and n eager ones."""
    import torch

    x = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    graph_s = _time_s(g.replay, 5) / n

    def eager():
        for _ in range(n):
            x.add_(1)

    eager_s = _time_s(eager, 3) / n
    return graph_s, eager_s


def probe_profile(device: Any = None, *, use_cache: bool = True) -> ArchProfile:
    """Probe the GPU `device` (index, torch.device or None = current). Reads the cache first (keyed by SKU,
    driver and torch version); otherwise measures (~10 s) and writes it. RuntimeError without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("probe_profile needs a CUDA GPU (use reference_profile(arch) on a CPU machine)")
    if device is None:
        idx = torch.cuda.current_device()
    elif isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        idx = d.index if d.index is not None else torch.cuda.current_device()
    dev = torch.device("cuda", idx)
    props = torch.cuda.get_device_properties(dev)
    sku = props.name
    path = _cache_path(sku, _driver_version(), torch.__version__)
    if use_cache:
        hit = read_cached(path)
        if hit is not None:
            return hit
    ref = static_profile(sku)
    arch = f"sm{props.major}{props.minor}"
    with torch.cuda.device(dev):
        l2 = int(getattr(props, "L2_cache_size", 0) or (ref.l2_bytes if ref else 0))
        dram = _bench_copy_bw(max(1 << 30, 8 * l2), 10)
        l2_bw = _bench_copy_bw(max(l2 // 4, 1 << 20), 200) if l2 else 0.0
        peaks = {d: _bench_matmul(d) for d in DTYPES}
        graph_s, eager_s = _bench_launch()
        torch.cuda.synchronize()
    clock = getattr(props, "clock_rate", 0)  # kHz where torch exposes it
    prof = ArchProfile(
        sku=sku, arch_family=arch, sm_count=int(props.multi_processor_count),
        smem_per_sm_bytes=int(getattr(props, "shared_memory_per_multiprocessor", 0)
                              or (ref.smem_per_sm_bytes if ref else 0)),
        l2_bytes=l2, sm_clock_mhz=float(clock / 1000 if clock else (ref.sm_clock_mhz if ref else 0.0)),
        dram_bw_bytes_s=dram, peak_ops_s=peaks, graph_launch_s=graph_s, eager_launch_s=eager_s,
        l2_bw_bytes_s=l2_bw, source="probe")
    write_cached(path, prof)
    return prof


def current_profile(arch_family: str | None = None, *, probe: bool = True) -> ArchProfile:
    """The profile the cost model uses now: with a GPU of that family (or any, when `arch_family` is None),
    its probe (from the cache; measured and cached first when absent and `probe` is True, which takes ~10 s);
    otherwise the device's static entry, else the family's static reference profile. ValueError with neither
    a GPU nor a family. A probe that fails falls back the same way."""
    fam = normalize_arch(arch_family) if arch_family else None
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        major, minor = torch.cuda.get_device_capability()
        here = f"sm{major}{minor}"
        if fam is None or fam == here:
            try:
                if probe:
                    return probe_profile()
                hit = read_cached(_cache_path(torch.cuda.get_device_name(), _driver_version(), torch.__version__))
                if hit is not None:
                    return hit
            except (RuntimeError, OSError):
                pass
            # no (usable) probe: the device's own static entry, else its family's reference
            st = static_profile(torch.cuda.get_device_name())
            if st is not None:
                return st
            fam = here
    if fam is None:
        raise ValueError("no GPU here: pass arch_family (e.g. 'sm90') to model a target GPU")
    return reference_profile(fam)


def with_overrides(profile: ArchProfile, **kw: Any) -> ArchProfile:
    """A copy with some fields replaced (a test or a what-if)."""
    return replace(profile, **kw)
