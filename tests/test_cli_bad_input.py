"""Bad input to the `oasr` command line (the audit after session 24): every case is a one-line usage error naming the
file, entry or option (exit 2, no traceback, nothing created or overwritten) or a documented fallback with one
warning. The helpers and the `home` fixture are tests/test_cli.py's.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from oasr_ops import cli
from test_cli import ROOT, _census_doc, _tree, _usage_error, home  # noqa: F401  (home: the fixture)

SIG = "gemm|op=gemm|dt=half|N=256|K=1024"
GOOD_REC = {"signature": SIG, "m": 64, "config": "torch", "median_s": 1e-5}


def _census_argv(home: Path, *extra: str, mode: str = "streaming") -> list[str]:
    return ["tune", "census", "--service-mode", mode, "--max-batch-size", "4", "--out", str(home / "in" / "c.json"),
            "--model", "examples.conformer:build_model", "--model-args", "size=S", "num_layers=1", *extra]


def _db_doc(arch_family: str = "sm90") -> dict:
    """A small tuning file: the shipped sm90 gemm file's first entry, without its eager table (so it changes)."""
    doc = json.loads((ROOT / "db" / "sm90" / "gemm.json").read_text())
    sig, entry = next(iter(doc["entries"].items()))
    entry.pop("regions_eager", None)
    doc["entries"] = {sig: entry}
    doc.pop("model", None)
    doc["arch_family"] = arch_family
    return doc


@pytest.fixture
def no_trace(monkeypatch):
    """The checks under test come before the model is traced: a trace fails the test at once (without the checks a
    1e300-second manifest or an infinite --max-seconds would build key lists until memory runs out)."""
    from oasr_ops.tune import census_cli

    def traced(*a, **k):
        raise AssertionError("the census traced the model: the input was not checked first")
    monkeypatch.setattr(census_cli, "census_for_model", traced)


@pytest.fixture
def no_nvcc(monkeypatch):
    """Prebuild's option checks come before compiling: without them nothing is compiled here (nvcc 'missing')."""
    from oasr_ops.tune import prebuild

    monkeypatch.setattr(prebuild, "nvcc_path", lambda: None)


# ----------------------------------------------------------------------------- A: data lost, clobbered or wrong

@pytest.mark.parametrize("what", ["--manifest", "--capture", "--concurrency", "--model", "link"])
def test_census_out_never_overwrites_an_input(home, capsys, no_trace, what):
    """`--out` naming (a link to) a file the census reads replaced it with the census."""
    inp = home / "in"
    manifest, capture, conc = inp / "m.jsonl", inp / "cap.jsonl", inp / "conc.json"
    manifest.write_text('{"duration": 3}\n')
    capture.write_text(json.dumps({"signature": SIG, "m": 8, "calls": 2}) + "\n")
    conc.write_text('{"1": 1}')
    model = inp / "mymodel.py"
    model.write_text("def build():\n    raise AssertionError('never imported')\n")
    mode = "offline" if what in ("--manifest", "link") else "streaming"
    base = ["tune", "census", "--service-mode", mode, "--max-batch-size", "2"]
    target = {"--manifest": manifest, "--capture": capture, "--concurrency": conc, "--model": model,
              "link": manifest}[what]
    out = target
    if what == "link":
        out = inp / "census.json"
        out.symlink_to(manifest)
    inputs = {"--manifest": ["--manifest", str(manifest)], "link": ["--manifest", str(manifest)],
              "--capture": ["--capture", str(capture)], "--concurrency": ["--concurrency", str(conc)], "--model": []}
    model_spec = f"{model}:build" if what == "--model" else "examples.conformer:build_model"
    before = target.read_text()
    _usage_error(home, capsys, [*base, "--out", str(out), "--model", model_spec, *inputs[what]], f"--out {out}",
                 str(target), "write the census elsewhere")
    assert target.read_text() == before


def test_serving_regions_refuses_a_file_of_another_arch(home, capsys, monkeypatch):
    """A file whose header says sm80 under sm90/ was read, then `publish` moved it aside and wrote a new file holding
    only the changed entries: every other entry was lost."""
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(home / "udb"))
    f = home / "udb" / "sm90" / "gemm.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps(_db_doc("sm80")))
    before = f.read_text()
    _usage_error(home, capsys, ["tune", "serving-regions", "--arch", "sm90", "--tier", "user"], str(f),
                 "arch_family 'sm80' != 'sm90'", "nothing written")
    assert f.read_text() == before and sorted(p.name for p in f.parent.iterdir()) == ["gemm.json"]
    # the same file with the right header is rewritten as before
    f.write_text(json.dumps(_db_doc("sm90")))
    assert cli.main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user"]) == 0
    assert "1 entry changed" in capsys.readouterr().out


def test_build_from_log_partitions_for_the_arch_it_publishes(home, capsys, monkeypatch):
    """`--from-log` partitioned for `--arch or "sm90"` but published for the resolved arch (OASR_ARCH here): the
    regions of an sm80 file came from sm90's candidates."""
    from oasr_ops.tune import from_log

    seen = []
    real = from_log.partition_logged

    def spy(sig, table, weights, held, arch, *a, **kw):
        seen.append(arch)
        return real(sig, table, weights, held, arch, *a, **kw)

    monkeypatch.setattr(from_log, "partition_logged", spy)
    monkeypatch.setenv("OASR_ARCH", "sm80")
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    out = home / "in" / "db"
    assert cli.main(["tune", "build", "--from-log", str(log), "--out", str(out)]) == 0
    capsys.readouterr()
    assert seen == ["sm80"]
    assert json.loads((out / "sm80" / "gemm.json").read_text())["arch_family"] == "sm80"


@pytest.mark.parametrize("opt,value,needle", [("--min-speedup", "nan", "finite number >= 1"),
                                              ("--min-speedup", "inf", "finite number >= 1"),
                                              ("--min-speedup", "0.5", "finite number >= 1"),
                                              ("--max-loss", "nan", "finite number >= 0"),
                                              ("--max-loss", "-0.1", "finite number >= 0")])
def test_build_partition_thresholds_are_finite(home, capsys, opt, value, needle):
    """`--min-speedup nan` exited 0 and wrote regions no comparison could gate."""
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90", "--out",
                                str(home / "in" / "db"), opt, value], opt, needle)


@pytest.mark.parametrize("opt,value", [("--min-speedup", "nan"), ("--max-loss", "nan"), ("--max-loss", "-1")])
def test_matrix_partition_thresholds_are_finite(home, capsys, opt, value):
    """matrix takes build's thresholds and the same checks (NaN passed there too)."""
    census = home / "in" / "c.json"
    census.write_text(json.dumps({"kind": "oasr-census", "signatures": {}}))
    _usage_error(home, capsys, ["tune", "matrix", "--census", str(census), "--arch", "sm90", "--dry-run",
                                "--out", str(home / "in" / "m"), opt, value], opt, "finite number")


@pytest.mark.parametrize("doc,needle", [
    ({"1": -1, "2": 1}, "width 1: weight must be a finite number >= 0"),
    ({"1": float("nan")}, "weight must be a finite number >= 0"),
    ({"64": 1}, "width 64 is not in 1..4"),
    ({"0": 1}, "width 0 is not in 1..4"),
    ({"1": 0, "2": 0}, "every weight is 0"),
    ({"x": 1}, "width 'x' is not an integer"),
    ({"1": "heavy"}, "weight must be a finite number >= 0"),
    ({}, "expected {width: weight}"),
    ([1], "expected {width: weight}"),
], ids=["negative", "nan", "over-max", "zero-width", "all-zero", "width-str", "weight-str", "empty", "list"])
def test_census_concurrency_is_checked_before_tracing(home, capsys, no_trace, doc, needle):
    """{"64": 1} with --max-batch-size 4 gave all-zero traffic; a negative or NaN weight a census build refuses."""
    f = home / "in" / "conc.json"
    f.write_text(json.dumps(doc))
    _usage_error(home, capsys, _census_argv(home, "--concurrency", str(f)), f"--concurrency {f}", needle)


@pytest.mark.parametrize("text,needle", [
    (json.dumps({"signature": SIG, "m": -8, "calls": 2}), ":1: m must be an integer > 0"),
    (json.dumps({"signature": SIG, "m": 8, "calls": 2.5}), ":1: calls must be an integer >= 0"),
    (json.dumps({"signature": SIG, "m": 8, "calls": "many"}), ":1: calls must be an integer >= 0"),
    (json.dumps({"signature": "gemm|bogus", "m": 8}), ":1: signature \"gemm|bogus\" is not a tuning signature"),
    ("\n" + json.dumps({"signature": SIG, "m": 8}) + "\n{cut", ":3: not JSON"),
    (b"\xff\xfe{}", "not UTF-8 text"),
], ids=["m-negative", "calls-fraction", "calls-str", "signature", "truncated", "not-utf8"])
def test_census_capture_records_are_checked_before_tracing(home, capsys, no_trace, text, needle):
    """A capture record with a negative M made a census `oasr tune build` refuses (after the trace); `"calls":
    "many"` and a non-UTF-8 file were tracebacks."""
    f = home / "in" / "cap.jsonl"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    _usage_error(home, capsys, _census_argv(home, "--capture", str(f)), f"--capture {f}", needle)


@pytest.mark.parametrize("duration", ["NaN", "Infinity", "true", '"5"'])
def test_census_manifest_durations_are_finite(home, capsys, no_trace, duration):
    f = home / "in" / "m.jsonl"
    f.write_text('{"duration": 2}\n{"duration": %s}\n' % duration)
    _usage_error(home, capsys, _census_argv(home, "--manifest", str(f), mode="offline"), f"--manifest {f}:2",
                 "positive 'duration'")


@pytest.mark.parametrize("argv,needle", [
    (["--max-seconds", "inf"], "--max-seconds: 'inf' must be a finite number > 0"),
    (["--max-seconds", "nan"], "--max-seconds: 'nan' must be a finite number > 0"),
    (["--max-seconds", "1e9"], "time buckets"),
    (["--concurrency-mean", "inf"], "--concurrency-mean: 'inf' must be a finite number > 0"),
])
def test_census_numbers_are_finite(home, capsys, no_trace, argv, needle):
    _usage_error(home, capsys, _census_argv(home, *argv, mode="offline"), needle)


def test_census_long_manifest_utterance_is_bounded(home, capsys, no_trace):
    f = home / "in" / "m.jsonl"
    f.write_text('{"duration": 1e300}\n')
    _usage_error(home, capsys, _census_argv(home, "--manifest", str(f), mode="offline"), f"--manifest {f}",
                 "longest utterance", "time buckets")


# ------------------------------------------------------------------------------- B: tracebacks -> one line

@pytest.mark.parametrize("line,needle", [
    ("[1, 2]", ":1: not a JSON object"),
    (json.dumps({**GOOD_REC, "weight": "heavy"}), ":1: weight must be a finite number >= 0"),
    (json.dumps(GOOD_REC).replace('"m": 64', '"m": 1e400'), ":1: m must be an integer > 0"),
    (json.dumps({**GOOD_REC, "median_s": "fast"}), ":1: median_s must be a number"),
    (json.dumps({**GOOD_REC, "signature": 5}), ":1: signature must be a string"),
    ("[" * 100_000, ":1: JSON nested too deeply"),
], ids=["list", "weight-str", "m-overflow", "median-str", "signature-int", "deep"])
def test_evaluate_log_records_are_checked(home, capsys, line, needle):
    log = home / "in" / "m.jsonl"
    log.write_text(line + "\n")
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log)], f"--log {log}", needle)


def test_evaluate_bad_arch_names_its_source(home, capsys, monkeypatch):
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log), "--arch", "bogus"], "--arch bogus",
                 "not an arch family")
    monkeypatch.setenv("OASR_ARCH", "bogus")
    err = _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log)], "OASR_ARCH", "not an arch family")
    assert "--arch" not in err
    assert cli.main(["tune", "evaluate", "--log", str(log), "--arch", "sm90"]) == 0  # --arch wins over the env
    assert cli.main(["tune", "evaluate", "--log", str(log), "--default-config", "torch"]) == 0  # no arch read
    capsys.readouterr()


@pytest.mark.parametrize("regions,needle", [
    ([[64, "torch", "x"]], "region 0 [64, \"torch\", \"x\"] is not [m_hi"),
    ([["big", "torch"]], "region 0 [\"big\", \"torch\"] is not [m_hi"),
    ([[64, "torch"], [True, "torch"]], "region 1 [true, \"torch\"]"),
    ("t64", "regions is not a list"),
], ids=["three", "m-str", "m-bool", "not-list"])
def test_evaluate_db_regions_are_checked(home, capsys, regions, needle):
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    db = home / "in" / "db.json"
    db.write_text(json.dumps({"entries": {SIG: {"regions": regions}}}))
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log), "--db", f"x={db}"], f"--db {db}",
                 f"entry '{SIG}'", needle)


def test_evaluate_refuses_a_log_without_measurements_and_a_db_of_another_family(home, capsys, monkeypatch):
    """A manifest given as --log scored "0 measured points" with exit 0, and a scaled_mm DB scored against a gemm
    log exactly like the `default` arm: both are usage errors now. `--db NAME=~/...` reaches the file (no shell
    expands a ~ inside that word)."""
    manifest = home / "in" / "manifest.jsonl"
    manifest.write_text(json.dumps({"audio": "a.wav", "duration": 3.2}) + "\n")
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(manifest)], f"--log {manifest}", "no measured arm")
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    other = home / "in" / "smm.json"
    smm_sig = "scaled_mm|op=scaled_mm|dt=int8|N=8|K=16"
    other.write_text(json.dumps({"entries": {smm_sig: {"regions": [[None, "torch"]]}}}))
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log), "--db", f"x={other}"], f"--db {other}",
                 "scaled_mm signatures", "the log measured gemm")
    db = home / "in" / "db.json"
    db.write_text(json.dumps({"entries": {SIG: {"regions": [[None, "torch"]]}}}))
    monkeypatch.setenv("HOME", str(home / "in"))
    assert cli.main(["tune", "evaluate", "--log", str(log), "--db", "x=~/db.json", "--arch", "sm90"]) == 0
    assert "x" in capsys.readouterr().out


def test_evaluate_db_nested_too_deeply(home, capsys):
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    db = home / "in" / "db.json"
    db.write_text("[" * 100_000 + "]" * 100_000)
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log), "--db", f"x={db}"], f"--db {db}",
                 "nested too deeply")


_MODELS = {
    "returns_none": ("def build():\n    return None\n", "the builder returned NoneType, not a torch.nn.Module"),
    "raises": ("def build():\n    raise RuntimeError('boom in the builder')\n",
               "RuntimeError: boom in the builder"),
    "syntax": ("def build(:\n    pass\n", "SyntaxError: "),
    "raises_on_import": ("raise KeyError('at import')\ndef build():\n    pass\n",
                         "KeyError: 'at import' (importing m_raises_on_import_"),
}


@pytest.fixture
def model_file(home, monkeypatch, request):
    """Write a model module under in/ (no bytecode: nothing may appear there) with a name of its own per test."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_builder appends the module's folder

    def write(kind: str, text: str) -> Path:
        name = f"m_{kind}_{abs(hash(request.node.nodeid)) % 10**8}"
        f = home / "in" / f"{name}.py"
        f.write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
        return f
    return write


@pytest.mark.parametrize("kind", sorted(_MODELS))
def test_census_a_failing_model_is_one_line(home, capsys, model_file, kind):
    text, needle = _MODELS[kind]
    f = model_file(kind, text)
    for spec in (f"{f}:build", f"{f.stem}:build"):  # a file path and a module name
        _usage_error(home, capsys, [*_census_argv(home)[:-5], "--model", spec], f"--model {spec}", needle)


def test_census_builder_traceback_under_verbose(home, capsys, model_file):
    f = model_file("raises", _MODELS["raises"][0])
    argv = [*_census_argv(home)[:-5], "--model", f"{f}:build"]
    assert cli.main(["-v", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "boom in the builder" in err  # the user's traceback, for debugging their code
    assert err.strip().splitlines()[-1].startswith("oasr tune census: error: --model")
    cli.setup_logging(0)


def test_census_input_the_model_rejects_is_one_line(home, capsys, model_file):
    """A model expecting 768-wide frames, censused with the default 80 mel bins, was a traceback from inside a
    LayerNorm decomposition: one line naming the input, the model's message and the flags that shape the input,
    and no census written; with --n-mels 768 it traces."""
    f = model_file("wide", "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.LayerNorm(768), "
                           "torch.nn.Linear(768, 256)).half()\n")
    argv = [*_census_argv(home)[:-5], "--model", f"{f}:build"]
    _usage_error(home, capsys, argv, f"--model {f}:build",
                 "rejects the census input [1, 16, 80] (torch.float16): RuntimeError: ", "--n-mels, --input-layout")
    assert not (home / "in" / "c.json").exists()
    assert cli.main([*argv, "--n-mels", "768"]) == 0
    capsys.readouterr()
    assert "gemm|op=gemm|dt=half|N=256|K=768" in json.loads((home / "in" / "c.json").read_text())["signatures"]


_TYPED_BUILDER = """import torch
def build(layers: int = 2, width=64.0, gelu=False, dtype=torch.float16, name: str = "x", seed: int | str = 0):
    assert isinstance(seed, str) and isinstance(name, str)  # a builder admitting str parses its own strings
    act = torch.nn.GELU() if gelu else torch.nn.ReLU()
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(80, int(width)), act,
                                                     torch.nn.Linear(int(width), 80)) for _ in range(layers)]).to(dtype)
"""


def test_census_model_args_take_the_builders_default_types(home, capsys, model_file):
    """`--model-args layers=2` reached an `int` parameter as '2' (a TypeError from deep in the builder): arguments
    whose default is a bool, int, float or torch.dtype are converted; a value that does not convert is one line."""
    f = model_file("typed", _TYPED_BUILDER)
    argv = [*_census_argv(home)[:-5], "--model", f"{f}:build", "--model-args"]
    assert cli.main([*argv, "layers=3", "width=96", "gelu=true", "dtype=bf16", "seed=5", "name=y"]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    doc = json.loads((home / "in" / "c.json").read_text())
    sigs = doc["signatures"]
    assert {"gemm|op=gemm_activation|dt=half|N=96|K=80", "gemm|op=gemm|dt=half|N=80|K=96"} <= set(sigs), sorted(sigs)
    assert {tuple(e["dtypes"]) for e in sigs.values()} == {("bf16",)}  # (layers="3" as a string fails range())
    assert doc["model_args"]["layers"] == "3"  # the census records what was typed
    (home / "in" / "c.json").unlink()
    for arg, needle in (("layers=two", "layers='two': not int (the builder's default is 2)"),
                        ("gelu=maybe", "gelu='maybe': not a bool"), ("dtype=fp64", "dtype='fp64': not a dtype")):
        _usage_error(home, capsys, [*argv, arg], "--model-args", needle)


def test_census_names_stock_layers_on_the_fast_path(home, capsys):
    """A stock fp16 nn.TransformerEncoder in eval: its layers meet PyTorch's fast-path conditions, so a compiled model
    under no_grad serves none of their GEMMs, yet the census (traced on the meta device) lists them. One warning names
    the layers and the census records them; quantized (--quantization), the layers leave the fast path: no warning."""
    spec = "benchmarks.stock_transformer:build_model"
    argv = [*_census_argv(home)[:-5], "--model", spec, "--model-args", "d=64", "heads=2", "ffn=128", "layers=2",
            "--n-mels", "64"]
    out = home / "in" / "c.json"
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "2 nn.TransformerEncoderLayer(s) (layers.0, layers.1) meet" in err, err
    doc = json.loads(out.read_text())
    assert doc["fast_path_layers"] == ["layers.0", "layers.1"]
    assert "gemm|op=gemm|dt=half|N=192|K=64" in doc["signatures"]  # the packed in-projection, censused all the same
    out.unlink()
    assert cli.main([*argv, "--quantization", "int8_w8a8"]) == 0
    assert "fast-path" not in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["fast_path_layers"] == [] and "scaled_mm|op=scaled_mm|N=192|K=64" in doc["signatures"]


def test_census_of_a_model_without_parameters_warns_and_writes(home, capsys, model_file):
    """nn.ReLU() (no parameters) was a StopIteration traceback: it traces (fp16 input on the CPU) to an empty census,
    with one warning."""
    f = model_file("relu", "import torch\ndef build():\n    return torch.nn.ReLU()\n")
    out = home / "in" / "c.json"
    assert cli.main([*_census_argv(home)[:-5], "--model", f"{f}:build"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "the census is empty" in err
    assert json.loads(out.read_text())["signatures"] == {}


@pytest.mark.parametrize("rec,needle", [
    ({**GOOD_REC, "m": 1e400}, "m must be an integer > 0"),
    ({**GOOD_REC, "weight": "heavy"}, "weight must be a finite number >= 0"),
    ({**GOOD_REC, "eager_fraction": "x"}, "eager_fraction must be in [0, 1]"),
    ({**GOOD_REC, "eager_fraction": 2}, "eager_fraction must be in [0, 1]"),
    ({**GOOD_REC, "validators": [1, 2]}, "validators must be an object"),
    ({**GOOD_REC, "sigma_s": "x"}, "sigma_s must be a number"),
    ({**GOOD_REC, "median_s": None}, "median_s must be a number >= 0"),
    ({**GOOD_REC, "median_s": float("nan")}, "median_s must be a number >= 0"),
    ([GOOD_REC], "not a JSON object"),
    ({k: v for k, v in GOOD_REC.items() if k != "config"}, "lacks one of"),
    ({**GOOD_REC, "signature": "gemm|bogus"}, "signature 'gemm|bogus' is not a tuning signature"),
], ids=["m-overflow", "weight-str", "eager-str", "eager-2", "validators-list", "sigma-str", "median-null",
        "median-nan", "list", "no-config", "signature"])
def test_build_from_log_record_values_are_checked(home, capsys, rec, needle):
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n" + json.dumps(rec) + "\n")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90", "--out",
                                str(home / "in" / "db")], f"--from-log {log}:2", needle)


def test_build_from_log_of_another_family(home, capsys):
    """A conv1d log under --family gemm was a traceback from publish; a mixed log is filtered with one warning."""
    conv = {**GOOD_REC, "signature": "conv1d|op=conv1d_btc|dt=half|N=512|K=15872"}
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(conv) + "\n")
    out = home / "in" / "db"
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90", "--out", str(out)],
                 "no measurement records of the gemm family", "1 conv1d", "--family")
    log.write_text(json.dumps(conv) + "\n" + json.dumps(GOOD_REC) + "\n")
    assert cli.main(["tune", "build", "--from-log", str(log), "--arch", "sm90", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "1 conv1d record(s) of other families left out" in cap.err
    assert list(json.loads((out / "sm90" / "gemm.json").read_text())["entries"]) == [SIG]


def test_build_from_log_output_tier_is_checked(home, capsys, monkeypatch):
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    argv = ["tune", "build", "--from-log", str(log), "--arch", "sm90"]
    _usage_error(home, capsys, [*argv, "--out", ""], "--out: empty")
    regular = home / "in" / "file"
    regular.write_text("x")
    _usage_error(home, capsys, [*argv, "--out", str(regular / "sub")], f"{regular} is not a directory")
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(regular))
    _usage_error(home, capsys, [*argv, "--out", "user"], "--out user (OASR_TUNE_USER_DB)",
                 f"{regular} is not a directory")
    _usage_error(home, capsys, [*argv, "--arch", "sm100", "--out", str(home / "in")], "no gemm lane is native")


@pytest.mark.parametrize("plan", ["[1]", '{"fingerprint": 5}', "{}"])
def test_matrix_resume_of_a_foreign_plan_file(home, capsys, plan):
    c = home / "in" / "c.json"
    c.write_text(json.dumps(_census_doc()))
    out = home / "in" / "mx2"
    p = out / "runs" / "r1" / "plan.json"
    p.parent.mkdir(parents=True)
    p.write_text(plan)
    _usage_error(home, capsys, ["tune", "matrix", "--census", str(c), "--arch", "sm90", "--dry-run", "--run-id",
                                "r1", "--out", str(out)], "--run-id r1", str(p), "not a run plan")


def test_serving_regions_bad_tier_and_entries(home, capsys, monkeypatch):
    monkeypatch.setenv("OASR_TUNE_USER_DB", "off")
    _usage_error(home, capsys, ["tune", "serving-regions", "--arch", "sm90", "--tier", "user"],
                 "--tier user: the user tier is disabled")
    _usage_error(home, capsys, ["tune", "serving-regions", "--arch", "sm90", "--tier", str(home / "in"),
                                "--seed-from", "user"], "--seed-from user: the user tier is disabled")
    regular = home / "in" / "file"
    regular.write_text("x")
    _usage_error(home, capsys, ["tune", "serving-regions", "--arch", "sm90", "--tier", str(regular),
                                "--seed-from", "system"], f"--tier {regular}", "is not a directory")
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(home / "udb"))
    f = home / "udb" / "sm90" / "gemm.json"
    f.parent.mkdir(parents=True)
    for bad in (["big", "torch"], [64, "torch", "x"]):
        doc = _db_doc()
        sig, entry = next(iter(doc["entries"].items()))
        entry["regions"][0] = bad
        f.write_text(json.dumps(doc))
        _usage_error(home, capsys, ["tune", "serving-regions", "--arch", "sm90", "--tier", "user"], str(f),
                     f"entry '{sig}'", "region 0", "nothing written")


# ----------------------------------------------------------------------------------- C: messages and options

@pytest.mark.parametrize("opt,value,needle", [("--top-k", "-3", "must be >= 1"), ("--max-fill", "-5", "must be >= 0"),
                                              ("--max-points", "1", "must be >= 2")])
@pytest.mark.parametrize("cmd", ["prebuild", "build"])
def test_build_and_prebuild_take_the_same_counts(home, capsys, no_nvcc, cmd, opt, value, needle):
    c = home / "in" / "c.json"
    c.write_text(json.dumps(_census_doc()))
    arch = "9.0a" if cmd == "prebuild" else "sm90"
    _usage_error(home, capsys, ["tune", cmd, "--census", str(c), "--arch", arch, opt, value], opt, needle)


@pytest.mark.parametrize("flags", [["--thin"], ["--max-points", "4"], ["--no-prune", "--top-k", "3"]])
def test_prebuild_census_options_need_a_census(home, capsys, no_nvcc, flags):
    """`--thin` & co. shape a --census plan; without --census they were accepted silently and the whole production
    set started compiling."""
    _usage_error(home, capsys, ["tune", "prebuild", "--arch", "9.0a", *flags], flags[0], "pass --census FILE")


def test_prebuild_names_the_census_not_the_arch(home, capsys, no_nvcc):
    """Every ValueError of the planning was reported as `--arch: ...`."""
    c = home / "in" / "c.json"
    c.write_text(json.dumps(_census_doc("gemm|op=gemm|dt=half|N=0|K=0")))
    err = _usage_error(home, capsys, ["tune", "prebuild", "--arch", "9.0a", "--census", str(c)], f"--census {c}",
                       "malformed signature")
    assert "--arch" not in err
    _usage_error(home, capsys, ["tune", "prebuild", "--arch", "sm77x"], "--arch", "not an arch family")


def test_prebuild_quiet_leaves_the_global_q_alone(home, capsys, monkeypatch):
    """prebuild's `--quiet` (dest `quiet`) overwrote the global -q's count: `oasr -q tune prebuild` logged at INFO.
    Now both hide the progress bar and -q sets the log level."""
    from oasr_ops.tune import prebuild

    seen = []

    class Report:
        failed = []

        def summary(self) -> str:
            return "0 built"

    def fake_build_many(specs, jobs=None, progress=True):
        seen.append(progress)
        return Report()

    monkeypatch.setattr(prebuild, "nvcc_path", lambda: "/usr/bin/true")
    monkeypatch.setattr(prebuild, "build_many", fake_build_many)
    argv = ["tune", "prebuild", "--arch", "9.0a", "--configs", "torch"]
    monkeypatch.setattr(prebuild, "plan_specs", lambda *a, **k: [])
    assert cli.main(["-q", *argv]) == 0
    assert logging.getLogger("oasr_ops").level == logging.WARNING and seen == [False]
    assert cli.main([*argv, "--quiet"]) == 0 and seen[-1] is False
    assert logging.getLogger("oasr_ops").level == logging.INFO
    assert cli.main(argv) == 0 and seen[-1] is True
    capsys.readouterr()


def test_status_names_a_bad_oasr_arch(home, capsys, monkeypatch):
    monkeypatch.setenv("OASR_ARCH", "bogus")
    err = _usage_error(home, capsys, ["tune", "status"], "OASR_ARCH", "not an arch family")
    assert "--arch" not in err
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps(GOOD_REC) + "\n")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log)], "OASR_ARCH", "not an arch family")
    _usage_error(home, capsys, ["tune", "status", "--arch", "sm77x"], "--arch")
