"""Compile every int8 scaled_mm kernel the GPU suite and the scaled_mm build use, without a GPU (for sm90)."""
import sys

from oasr_ops.codegen.jit import JitSpec, build_many
from oasr_ops.runtime.registry import get_lane

ARCH = "sm90"
lane, sm80 = get_lane("sm90_int8_wgmma"), get_lane("sm80_int8_mma")
specs = [JitSpec.for_kernel(lane, c, dt, ARCH) for c in lane.space for dt in ("fp16", "bf16")]
specs += [JitSpec.for_kernel(lane, c, "int8", ARCH) for c in lane.space if c.kernel_schedule != "streamk"]
specs += [JitSpec.for_kernel(sm80, c, dt, ARCH) for c in sm80.space[:3] for dt in ("fp16", "int8")]
jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
report = build_many(specs, jobs=jobs)
print(report.summary())
sys.exit(1 if report.failed else 0)
