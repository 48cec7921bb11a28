"""`oasr_ops.tune.select` — the public import path of selection; the module is `oasr_ops.runtime.select`."""
from ..runtime.select import *  # noqa: F401,F403
from ..runtime.select import Selection, region_table, resolve_in_table, select_config  # noqa: F401
from ..runtime.select_report import reset_counts, resolution_counts, tuning_report  # noqa: F401
