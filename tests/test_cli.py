"""The `oasr` command line's user errors, help and output (issue 12, "CLI"), and quantize_'s config objects.

Every user error: exit code 2, ONE line on stderr naming the problem (no traceback), nothing created. The runs go
through `cli.main(argv)` (one through a real subprocess) with the cache and user tier under tmp_path, and each
asserts that tmp_path holds nothing it did not hold before.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oasr_ops import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Cache and user tier under tmp_path (so "nothing created" is checkable), inputs in tmp_path/in."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("OASR_TUNE_USER_DB", raising=False)
    monkeypatch.chdir(ROOT)  # --model examples.conformer:... resolves from the checkout
    (tmp_path / "in").mkdir()
    return tmp_path


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _usage_error(home: Path, capsys, argv: list[str], *needles: str) -> str:
    """Run `oasr argv`; assert exit 2, one stderr line holding every needle, no traceback, nothing created."""
    before = _tree(home)
    rc = cli.main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert rc == 2, (rc, cap.err)
    assert len(err.splitlines()) == 1, cap.err
    assert "Traceback" not in err and "error:" in err
    for n in needles:
        assert n in err, (n, err)
    assert _tree(home) == before, _tree(home) - before
    return err


def _census_doc(sig: str = "gemm|op=gemm|dt=half|N=256|K=1024") -> dict:
    return {"schema": 1, "kind": "oasr-census", "service_mode": "offline", "keys": [],
            "signatures": {sig: {"family": "gemm", "op": "gemm", "n": 256, "k": 1024, "dtypes": ["fp16"],
                                 "points": [{"m": 64, "weight": 1.0, "calls": 1, "must_tune": True}]}}}


# ------------------------------------------------------------------------------------------------------ build

def test_build_missing_census_names_the_file_before_the_gpu(home, capsys):
    missing = home / "in" / "nope.json"
    err = _usage_error(home, capsys, ["tune", "build", "--census", str(missing)], str(missing), "no such file")
    assert "GPU" not in err
    assert not (home / "cache").exists()  # no measurements directory either


def test_build_rejects_a_file_that_is_not_a_census(home, capsys):
    f = home / "in" / "x.json"
    f.write_text(json.dumps({"schema": 2, "entries": {}}))
    _usage_error(home, capsys, ["tune", "build", "--census", str(f)], str(f), "not a census")
    f.write_text("{not json")
    _usage_error(home, capsys, ["tune", "build", "--census", str(f)], str(f), "not valid JSON")


def _with_point(point) -> dict:
    doc = _census_doc()
    next(iter(doc["signatures"].values()))["points"] = [point]
    return doc


@pytest.mark.parametrize("doc,needle", [
    (_with_point({"weight": 1.0}), "point 0: needs an integer m > 0"),
    (_with_point({"m": "64"}), "point 0: needs an integer m > 0"),
    (_with_point({"m": 0}), "point 0: needs an integer m > 0"),
    (_with_point({"m": 64, "weight": float("nan")}), "weight must be a finite number"),
    (_with_point({"m": 64, "calls": -1}), "calls must be an integer >= 0"),
    (_with_point({"m": 64, "eager_fraction": 2}), "eager_fraction must be in [0, 1]"),
    (_with_point({"m": 64, "must_tune": "yes"}), "must_tune must be true or false"),
    (_with_point(64), "point 0: needs an integer m > 0"),
    ({"kind": "oasr-census", "signatures": {"gemm|op=gemm|N=1|K=1": {"points": 5}}}, "points must be a list"),
    ({"kind": "oasr-census", "signatures": {"gemm|op=gemm|N=1|K=1": [1]}}, "not an object"),
    ({"kind": "oasr-census", "signatures": {"gemm|op=gemm|N=1|K=1": {"n": -1}}}, "n must be an integer >= 0"),
], ids=["no-m", "m-str", "m-0", "weight-nan", "calls-neg", "eager-2", "must-tune-str", "point-int",
        "points-int", "body-list", "n-neg"])
@pytest.mark.parametrize("cmd", ["build", "prebuild", "matrix"])
def test_a_malformed_census_is_one_line_naming_the_point(home, capsys, doc, needle, cmd):
    """A hand-edited or truncated census (a file others write) is a usage error naming the file, the signature
    and the point, from every command that reads one — before session 23 a point without `m` was a KeyError
    traceback from `oasr tune build` and `oasr tune prebuild`, and prebuild called a bad value an `--arch` error."""
    f = home / "in" / "c.json"
    f.write_text(json.dumps(doc))
    argv = {"build": ["tune", "build", "--census", str(f), "--arch", "sm90"],
            "prebuild": ["tune", "prebuild", "--census", str(f), "--arch", "9.0a"],
            "matrix": ["tune", "matrix", "--census", str(f), "--arch", "sm90", "--dry-run",
                       "--out", str(home / "in" / "m")]}[cmd]
    _usage_error(home, capsys, argv, f"--census {f}", needle)


def test_library_readers_of_a_census_check_it_too(tmp_path):
    """`load_census` (prewarm's reader) and the build's `load_censuses` raise ValueError naming the problem."""
    from oasr_ops.tune.build import load_censuses
    from oasr_ops.tune.census_file import load_census

    with pytest.raises(ValueError, match="point 0: needs an integer m > 0"):
        load_census(_with_point({"M": -3}))
    f = tmp_path / "c.json"
    f.write_text(json.dumps(_with_point({"m": 64, "weight": -1})))
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
        load_censuses([str(f)])
    assert load_census(_census_doc())["signatures"]  # a well-formed one passes as it is
    from oasr_ops.tune.prewarm import points_from_census

    doc = _census_doc()
    del next(iter(doc["signatures"].values()))["op"]
    with pytest.raises(ValueError, match="lacks op"):
        points_from_census(doc)


def test_every_census_reader_takes_an_upper_case_m(tmp_path):
    """The check accepts a point's M spelled ``M``; prewarm read only ``m`` (a KeyError after a passing check,
    until session 24). Both readers now give the same point for either spelling."""
    from oasr_ops.tune.build import load_censuses
    from oasr_ops.tune.prewarm import points_from_census

    for spelling in ("m", "M"):
        doc = _census_doc()
        body = next(iter(doc["signatures"].values()))
        body["points"] = [{spelling: 96, "weight": 2.0, "must_tune": True}]
        [pt] = points_from_census(doc)
        assert (pt.m, pt.weight, pt.n, pt.k) == (96, 2.0, 256, 1024)
        f = tmp_path / f"c_{spelling}.json"
        f.write_text(json.dumps(doc))
        merged = load_censuses([str(f)])
        assert [p.m for w in merged.values() for p in w.points] == [96], merged


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_build_without_a_gpu_is_one_line_and_creates_nothing(home, capsys):
    f = home / "in" / "c.json"
    f.write_text(json.dumps(_census_doc()))
    _usage_error(home, capsys, ["tune", "build", "--census", str(f), "--arch", "sm90"], "GPU", "--from-log")


def test_build_with_no_signature_of_the_family(home, capsys):
    f = home / "in" / "c.json"
    f.write_text(json.dumps(_census_doc()))
    _usage_error(home, capsys, ["tune", "build", "--census", str(f), "--family", "bmm"], "no bmm signatures")


def test_build_from_log_missing_or_corrupt(home, capsys):
    log = home / "in" / "m.jsonl"
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90"], str(log), "no such file")
    good = {"signature": "gemm|op=gemm|dt=half|N=256|K=1024", "m": 64, "config": "torch", "median_s": 1e-5}
    log.write_text(json.dumps(good) + "\n" + "garbage\n")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90"], f"{log}:2",
                 "not JSON")
    log.write_text(json.dumps({"signature": "x", "m": "many"}) + "\n")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90"], f"{log}:1")
    log.write_text("\n")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90"], "no measurement records")
    log.write_text(json.dumps(good) + "\n")
    stamp = home / "in" / "s.json"
    stamp.write_text("[]")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm90", "--stamp-from",
                                str(stamp)], "--stamp-from", "not a tuning DB file")
    _usage_error(home, capsys, ["tune", "build", "--from-log", str(log), "--arch", "sm77x"], "--arch")


def test_build_option_errors(home, capsys):
    _usage_error(home, capsys, ["tune", "build"], "--census is required")
    _usage_error(home, capsys, ["tune", "build", "--census", "a.json", "--max-points", "1"], "--max-points",
                 "must be >= 2")  # the planner keeps the smallest and the largest M
    _usage_error(home, capsys, ["tune", "build", "--stamp-from", "a.json", "--census", "c.json"], "--stamp-from")
    _usage_error(home, capsys, ["tune", "build", "--census", "a", "--from-log", "b"], "exclude each other")


# ----------------------------------------------------------------------------------------------------- census

def test_census_model_errors(home, capsys):
    out = home / "in" / "census.json"
    base = ["tune", "census", "--service-mode", "offline", "--max-batch-size", "2", "--max-seconds", "1",
            "--out", str(out)]
    _usage_error(home, capsys, [*base, "--model", "no_such_module_xyz:build"], "--model", "cannot import",
                 "no_such_module_xyz")
    _usage_error(home, capsys, [*base, "--model", "examples.conformer:no_builder"], "has no function 'no_builder'")
    _usage_error(home, capsys, [*base, "--model", "examples.conformer"], "module:function")
    _usage_error(home, capsys, [*base, "--model", "examples.conformer:build_model", "--model-args", "bogus=1"],
                 "--model-args", "bogus")
    _usage_error(home, capsys, [*base, "--model", "examples.conformer:build_model", "--model-args", "novalue"],
                 "key=value")
    _usage_error(home, capsys, [*base[:-1], str(home / "in" / "no_dir" / "c.json"), "--model",
                                "examples.conformer:build_model"], "does not exist")
    _usage_error(home, capsys, [*base, "--model", "examples.conformer:build_model", "--manifest",
                                str(home / "in" / "m.jsonl")], "--manifest", "no such file")
    (home / "in" / "m.jsonl").write_text('{"duration": -1}\n')
    _usage_error(home, capsys, [*base, "--model", "examples.conformer:build_model", "--manifest",
                                str(home / "in" / "m.jsonl")], "positive 'duration'")
    _usage_error(home, capsys, [*base, "--model", "examples.conformer:build_model", "--max-batch-size", "0"],
                 "--max-batch-size")
    assert not out.exists()


def test_census_offline_needs_traffic(home, capsys):
    _usage_error(home, capsys, ["tune", "census", "--model", "examples.conformer:build_model", "--service-mode",
                                "offline", "--max-batch-size", "2", "--out", str(home / "in" / "c.json")],
                 "--manifest")


def test_census_reports_progress_without_carriage_returns(home, capsys):
    out = home / "in" / "c.json"
    rc = cli.main(["tune", "census", "--model", "examples.conformer:build_model", "--model-args", "size=S",
                   "num_layers=1", "--service-mode", "streaming", "--max-batch-size", "2", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0 and out.exists()
    assert "\r" not in cap.err  # stderr is not a terminal: no bar
    assert "tracing 2 graph key(s)" in cap.err and "trace 1" in cap.err  # the log says what it is doing
    assert cap.out.startswith("census:") and str(out) in cap.out  # the result on stdout
    assert cli.main(["-q", "tune", "census", "--model", "examples.conformer:build_model", "--model-args", "size=S",
                     "num_layers=1", "--service-mode", "streaming", "--max-batch-size", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""  # -q: warnings only


# ------------------------------------------------------------------------------------ prebuild / diff / evaluate

def test_prebuild_dtypes_are_validated(home, capsys):
    _usage_error(home, capsys, ["tune", "prebuild", "--arch", "9.0a", "--dtypes", "../../x"], "--dtypes",
                 "fp16, bf16")
    _usage_error(home, capsys, ["tune", "prebuild", "--arch", "9.0a", "--jobs", "0"], "--jobs")
    _usage_error(home, capsys, ["tune", "prebuild", "--arch", "9.0a", "--configs", "not_an_id"], "--configs")


def test_diff_refuses_json_that_is_not_a_tuning_db(home, capsys):
    a = home / "in" / "a.json"
    b = home / "in" / "b.json"
    a.write_text(json.dumps({"schema": 2, "kernel_family": "gemm", "arch_family": "sm90", "entries": {}}))
    b.write_text(json.dumps({"hello": 1}))
    _usage_error(home, capsys, ["tune", "diff", str(a), str(b)], str(b), "not a tuning DB file")
    b.write_text(json.dumps(_census_doc()))
    _usage_error(home, capsys, ["tune", "diff", str(a), str(b)], "not a tuning DB file")
    _usage_error(home, capsys, ["tune", "diff", str(a), str(home / "in" / "none.json")], "no such file")
    assert cli.main(["tune", "diff", str(a), str(a)]) == 0


def test_evaluate_plot_without_matplotlib_is_an_error(home, capsys, monkeypatch):
    log = home / "in" / "m.jsonl"
    log.write_text(json.dumps({"signature": "gemm|op=gemm|dt=half|N=8|K=8", "m": 8, "config": "torch",
                               "median_s": 1e-5}) + "\n")
    png = home / "in" / "r.png"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(log), "--plot", str(png)],
                 "pip install oasr_ops[plot]")
    assert not png.exists()
    _usage_error(home, capsys, ["tune", "evaluate", "--log", str(home / "in" / "none.jsonl")], "no such file")


def test_argparse_errors_take_the_same_path(home, capsys):
    _usage_error(home, capsys, [], "oasr: error:")
    _usage_error(home, capsys, ["tune", "nope"], "invalid choice")
    _usage_error(home, capsys, ["tune", "status", "--bogus"], "--bogus")


def test_a_bug_keeps_its_traceback(home, monkeypatch):
    from oasr_ops.tune import status

    def boom(arch=None):
        raise RuntimeError("a bug")
    monkeypatch.setattr(status, "status_data", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["tune", "status"])


def test_subprocess_exit_code_and_single_line(home):
    env = {**os.environ, "XDG_CACHE_HOME": str(home / "cache"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "oasr_ops", "tune", "build", "--census", "missing.json"],
                       capture_output=True, text=True, env=env, cwd=home / "in", timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "oasr tune build: error: --census missing.json: no such file"
    assert not (home / "cache").exists()


# ----------------------------------------------------------------------------------------------------- help

def test_a_help_flag_on_the_command_line_reaches_our_parser_not_cutlass_library(home):
    """cutlass_library's generator parses the process's argv at import (`parse_known_args`): until session 24 the
    installed `oasr --help` printed cutlass_library's usage and exited, and so did any user program run with
    `--help` that imported oasr_ops (the scaled_mm family imported the emitter at package import). Now
    `import oasr_ops` imports no cutlass_library, and every emitter imports it with the argv hidden."""
    env = {**os.environ, "XDG_CACHE_HOME": str(home / "cache"), "PYTHONPATH": str(ROOT)}
    user_program = ("import sys; sys.argv = ['server.py', '--help']\n"
                    "import oasr_ops, oasr_ops.cli\n"
                    "assert 'cutlass_library' not in sys.modules, 'import oasr_ops loaded cutlass_library'\n"
                    "from oasr_ops.codegen import emit_fp8, emit_int8, emit\n"  # each guarded, any order
                    "print('server ran', emit_int8.L.DataType.s8.name)")
    r = subprocess.run([sys.executable, "-c", user_program], capture_output=True, text=True, env=env,
                       cwd=home / "in", timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "server ran s8", (r.stdout, r.stderr)
    console_script = "import sys; sys.argv = ['oasr', 'tune', '--help']; from oasr_ops.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", console_script], capture_output=True, text=True, env=env,
                       cwd=home / "in", timeout=300)  # what the installed `oasr` entry point does
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: oasr tune ") and "cutlass" not in r.stdout, r.stdout


def _parsers(p, out=None):
    import argparse

    out = out if out is not None else []
    out.append(p)
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                _parsers(sub, out)
    return out


def test_help_lists_subcommands_and_every_option_has_help_and_default(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for name in ("census", "build", "evaluate", "status", "diff", "prebuild"):
        assert f"oasr tune {name}" in text, name
    for p in _parsers(cli.build_parser()):
        fmt = p._get_formatter()
        for a in p._actions:
            if not a.option_strings or a.dest == "help":
                continue
            assert a.help, f"{p.prog} {a.option_strings}: no help"
            if a.default not in (None, False, []):
                assert "default" in fmt._get_help_string(a).lower(), f"{p.prog} {a.option_strings}: no default"
    with pytest.raises(SystemExit):
        cli.main(["tune", "census", "--help"])
    census_help = capsys.readouterr().out
    census = next(p for p in _parsers(cli.build_parser()) if p.prog == "oasr tune census")
    assert len(census.description) < 400  # a short usage; the design note lives in docs and the module docstring
    assert "Tracing (why it is fast)" not in census_help and census.description.split(".")[0] in " ".join(
        census_help.split())


def test_verbosity_sets_the_oasr_ops_logger(home, capsys):
    a = home / "in" / "a.json"
    a.write_text(json.dumps({"schema": 2, "kernel_family": "gemm", "arch_family": "sm90", "entries": {}}))
    for flags, level in (([], logging.INFO), (["-v"], logging.DEBUG), (["-q"], logging.WARNING)):
        assert cli.main([*flags, "tune", "diff", str(a), str(a)]) == 0
        assert logging.getLogger("oasr_ops").level == level
    ours = [h for h in logging.getLogger("oasr_ops").handlers if type(h) is type(cli._handler)]
    assert len(ours) == 1  # not one more per call


# -------------------------------------------------------------------------------------------------- quantize_

def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 24))


def test_quantize_accepts_a_config_object_like_the_string():
    import dataclasses

    import oasr_ops
    from oasr_ops.quantize import QuantLinear

    a, b = oasr_ops.quantize_(_model(), "int8_w8a8"), oasr_ops.quantize_(_model(), oasr_ops.Int8W8A8Config())
    for i in (0, 2):
        assert isinstance(a[i], QuantLinear) and isinstance(b[i], QuantLinear)
        assert torch.equal(a[i].weight_q, b[i].weight_q) and a[i].config == b[i].config == "auto"
    x = torch.randn(3, 64)
    assert torch.equal(a(x), b(x))
    c = oasr_ops.quantize_(_model(), oasr_ops.Int8W8A8Config(kernel="heuristic"), lambda m, fqn: fqn == "2")
    assert type(c[0]) is torch.nn.Linear and c[2].config == "heuristic"
    with pytest.raises(dataclasses.FrozenInstanceError):
        oasr_ops.Int8W8A8Config().kernel = "x"
    with pytest.raises(ValueError, match="kernel"):
        oasr_ops.Int8W8A8Config(kernel="")
    with pytest.raises(TypeError, match="no handler"):
        oasr_ops.quantize_(_model(), object())
    with pytest.raises(ValueError, match="unknown scheme"):
        oasr_ops.quantize_(_model(), "int4")


def test_quantize_handler_registry():
    from dataclasses import dataclass

    import oasr_ops
    from oasr_ops import quantize as q

    @dataclass(frozen=True)
    class Tag:
        name: str

    seen = []

    @q.register_quantize_handler(Tag)
    def _tag(model, cfg, filter_fn):
        seen.append((cfg.name, filter_fn))
        return model

    try:
        m = _model()
        assert oasr_ops.quantize_(m, Tag("t")) is m and seen == [("t", None)]
    finally:
        q._HANDLERS.pop(Tag)


def test_graph_pass_accepts_the_config_object():
    import torch.nn.functional as F

    from oasr_ops import Int8W8A8Config
    from oasr_ops.inductor.quantize_pass import quantize_graph

    def f(x, w, b):
        return F.linear(x, w, b)
    gm = torch.fx.symbolic_trace(f)
    w = torch.nn.Parameter(torch.randn(32, 64, dtype=torch.bfloat16))
    b = torch.randn(32, dtype=torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert quantize_graph(gm, [x, w, b], Int8W8A8Config(kernel="heuristic", layers="all")) == 1
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.oasr.scaled_mm.default)
    assert node.args[6] == "heuristic"  # the config every quantized layer's scaled_mm calls
    with torch.no_grad():
        got, want = gm(x, w, b).float(), F.linear(x, w, b).float()
    assert ((got - want).abs().max() / want.abs().max()).item() < 3e-2  # int8 accuracy vs the bf16 reference
    with pytest.raises(ValueError, match="quantization"):
        quantize_graph(torch.fx.symbolic_trace(f), [x, w, b], "int4")


def test_a_reader_that_goes_away_ends_the_command_quietly(monkeypatch, capsys):
    """`oasr tune diff A B | head`: the pipe closes under the command; one exit code, no traceback."""
    from oasr_ops.tune import status

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(status, "cmd_diff", closed_pipe)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after the test: main points it at os.devnull
    assert cli.main(["tune", "diff", "a.json", "b.json"]) == 141
    assert sys.stdout.name == os.devnull
    monkeypatch.undo()
    assert "Traceback" not in capsys.readouterr().err
