"""`oasr tune matrix`: build tuning files for several GPU architectures on a Dask distributed cluster (spec,
"Building on other architectures").

The job: compile every JIT module the builds load on CPU workers (one task per (arch, lane), the prebuild job
budget), measure each signature on a GPU worker of its architecture as soon as that architecture's compile lands
(one task per (arch, signature), exactly `oasr tune build`'s measuring and partition, checkpointed atomically when
it finishes), then one publish task per (arch, family) writes the tuning file. Dask owns the scheduling, retries,
worker loss and resources: a measuring worker advertises ``GPU=1`` and its arch family (``sm90=1``), a compile
worker ``compile=1``.

  plan.py     what a run does (the `--dry-run` output), run ids, where everything lives; no Dask, no GPU
  tasks.py    the task bodies (plain functions Dask runs on the workers)
  cluster.py  a local cluster (`--local-gpus/--local-cpus`) or a scheduler address; the only Dask imports
  driver.py   submits the tasks, follows them, writes the reports
  cli.py      `oasr tune matrix`

Dask is imported lazily (cluster.py, driver.py): `import oasr_ops` never needs it.
"""
