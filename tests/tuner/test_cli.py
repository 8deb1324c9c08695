"""The command line as a user runs it: real subprocesses of the installed console scripts."""

import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("NIGHTSHIFT_DB", None)
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "expect"), [
    (["--model", "resnet51"], "resnet50"),
    (["--model", "missing.onnx"], "not found"),
    (["--model", "tiny", "--device", "tpu:0"], "cuda:N"),
    (["--model", "tiny", "--trials", "0"], "--trials must be a positive"),
    (["--model", "tiny", "--trials", "-3"], "--trials must be a positive"),
    (["--model", "tiny", "--db", "/proc/nightshift.db"], "cannot write"),
    (["--model", "tiny", "--db", "/no/such/folder/t.db"], "does not exist"),
    (["--model", "tiny", "--batch-size", "0"], "--batch-size"),
    (["--model", "tiny", "--strategy", "annealing"], "--strategy must be one of evolutionary"),
    (["--model", "tiny", "--device", "cuda:0", "--target-arch", "sm_90", "--timing", "cold"],
     "--timing cold flushes CPU caches"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, expect):
    line = _one_line_error(run("tune", *args, cwd=tmp_path))
    assert expect in line


@pytest.mark.slow
def test_unknown_model_lists_known_ones(tmp_path):
    line = _one_line_error(run("nightshift", "tasks", "--model", "nope", cwd=tmp_path))
    for name in ("resnet18", "resnet50", "mobilenet_v2", "bert-base", "tiny"):
        assert name in line


def test_corrupt_onnx(tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"garbage" * 50)
    line = _one_line_error(run("tune", "--model", "broken.onnx", cwd=tmp_path))
    assert "not a valid ONNX model" in line


def test_corrupt_database(tmp_path):
    (tmp_path / "bad.db").write_bytes(b"not sqlite" * 100)
    line = _one_line_error(run("tune", "--model", "tiny", "--db", "bad.db", cwd=tmp_path))
    assert "cannot open tuning database" in line


@pytest.mark.slow
def test_tasks_table(tmp_path):
    proc = run("nightshift", "tasks", "--model", "tiny", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "fused_conv2d" in proc.stdout and "GFLOP per inference" in proc.stdout
    proc = run("nightshift", "tasks", "--model", "tiny", "--layout", "NHWC", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "NHWC" in proc.stdout and "NCHW" not in proc.stdout.replace("NHWC", "")


def test_whole_loop_on_tiny(tmp_path):
    """tasks -> candidates -> Ray builds and timings -> XGBoost -> SQLite -> compile -> check."""
    proc = run("tune", "--model", "tiny", "--device", "cpu", "--trials", "8",
               "--trials-per-batch", "4", "--db", "t.db", "-o", "tiny.so", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_closing_lines(proc)
    assert (tmp_path / "tiny.so").stat().st_size > 0
    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == 8
        ok = conn.execute("SELECT count(*) FROM records WHERE error_class IS NULL").fetchone()[0]
        assert ok >= 4
        assert conn.execute("SELECT state, trials_done FROM jobs").fetchall() == [("done", 8)]
        assert conn.execute("SELECT count(*) FROM cost_models").fetchone()[0] == 1
    # The compiler reads the same database without tuning again; --job takes the job's model.
    proc = run("nightshift", "compile", "--job", "tiny-cpu", "--db", "t.db", "-o", "again.so", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "job tiny-cpu: --model tiny --device cpu" in proc.stderr
    assert "operators tuned" in proc.stdout and not proc.stdout.startswith("0 operators tuned")


def _check_closing_lines(proc: subprocess.CompletedProcess) -> None:
    """tune's closing lines, as a snapshot with the figures left out: every latency a median with
    its IQR and method, every ratio "X.XXx of <reference>" (lower is better) against the
    fallback build and the peer, and a slower tuned build said with the reason."""
    stdout = proc.stdout
    assert "speed-up" not in stdout and "tuned / " not in stdout
    assert "tiny on cpu: latency in ms, medians of 5 interleaved rounds" in stdout
    ms, iqr = r"\d+\.\d{3}", r"\d+\.\d{3}-\d+\.\d{3}"
    for row in (r"fallback schedules \(0 trials\)", r"tuned \(\d+ ops tuned, \d+ default\)",
                r"TVM default build, timed apart \(\d+ runs\)"):  # fmt: skip
        assert re.search(rf"│ {row} +│ +{ms} │ +{iqr} │", stdout), row
    assert re.search(rf"^tuned build {ms} ms \(median of 5 runs, IQR {iqr} ms = \d+% of the median; each run copies "
                     r"the inputs in and the outputs out\)$", stdout, re.M)  # fmt: skip
    peer = importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("torch")
    tail = (r"; \d+\.\d\dx of (ONNX Runtime|OpenVINO)[^;]* \(lower is better; medians of 5 interleaved rounds\); "
            r"max error vs \S+ \S+$") if peer else "; no peer ran"  # fmt: skip
    closing = re.search(rf"^tuned build: (\d+\.\d\d)x of the fallback build \(0 trials\){tail}", stdout, re.M)
    assert closing, stdout
    assert re.search(r"^max relative output difference vs the TVM default build \S+$", stdout, re.M)
    ratio = float(closing.group(1))
    warned = "warning: the tuned build is slower than the fallback build (0 trials)" in proc.stderr
    if ratio > 1.0:  # 8 trials over the model's tasks: the reason is the trials a task
        assert warned and re.search(r"8 trials is too few for \d+ tasks \(\d+\.\d a task", proc.stderr)
    elif ratio < 1.0:
        assert not warned


def test_config_file_unknown_key_and_missing_model(tmp_path):
    (tmp_path / "bad.toml").write_text('model = "tiny"\ntrails = 5\n')
    assert "trails" in _one_line_error(run("tune", "--config", "bad.toml", cwd=tmp_path))
    assert "no model" in _one_line_error(run("tune", cwd=tmp_path))


def test_a_graph_tvm_cannot_import_is_one_line(tmp_path):
    """A valid ONNX graph that ONNX Runtime runs but TVM's importer does not know (DFT)."""
    import onnx
    from onnx import TensorProto, helper

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 2]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("DFT", ["x"], ["y"])], "dft", io[:1], io[1:])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / "dft.onnx"))
    for command in (["nightshift", "tasks"], ["tune", "--no-verify", "--db", "t.db"]):
        line = _one_line_error(run(*command, "--model", "dft.onnx", cwd=tmp_path))
        assert "DFT" in line and "TVM cannot import" in line
    assert not (tmp_path / "t.db").exists()


def test_a_failure_inside_tvm_is_one_line_and_its_trace_is_behind_v(capsys):
    """Any error a command does not expect (TVM's InternalError here) ends it with one line and
    exit 2; ``-v`` shows the trace."""
    import argparse

    import tvm

    from tuner.cli import _run

    def fails(_args: argparse.Namespace) -> int:
        raise tvm.error.InternalError("Traceback of TVM's C++ side\n  File x.cc, line 1\nCheck failed: (a) is false: b")

    assert _run(fails, argparse.Namespace(verbose=False)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "InternalError: Check failed: (a) is false: b" in lines[0] and "-v" in lines[0], err
    assert _run(fails, argparse.Namespace(verbose=True)) == 2
    assert "Traceback" in capsys.readouterr().err


def test_hints_keep_their_brackets(capsys):
    """Rich reads ``[onnx]`` as markup: an error's text is printed as it is, extras included."""
    import argparse

    from tuner.cli import _run
    from tuner.errors import UserInputError, install_hint

    def fails(_args: argparse.Namespace) -> int:
        raise UserInputError(f"reading ONNX files needs the onnx package: {install_hint('onnx')}")

    assert _run(fails, argparse.Namespace(verbose=False)) == 2
    assert "pip install -e '.[onnx]' in Nightshift's checkout" in capsys.readouterr().err


def _parsers():
    """``(prog, parser)`` of ``tune`` and of every ``nightshift`` command, group and subcommand."""
    import argparse

    from tuner.cli import build_parser, build_tune_parser

    def walk(prog, parser):
        yield prog, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(f"{prog} {name}", sub)

    return [("tune", build_tune_parser()), *walk("nightshift", build_parser())]


def test_every_help_ends_with_examples_that_parse():
    """Each --help has 1-3 example command lines, every one of which the parser accepts (so the
    options they use exist), under 80 columns; the commands users start with have a description."""
    import shlex

    from tuner.cli import build_parser, build_tune_parser

    parsers = dict(_parsers())
    for prog, parser in parsers.items():
        help_text = parser.format_help()
        assert "\nexamples:\n" in help_text, prog
        lines = parser.epilog.splitlines()[1:]
        assert 1 <= len(lines) <= 3 and all(len(line) <= 80 for line in lines), (prog, lines)
        for line in lines:
            argv = shlex.split(line)
            assert " ".join(argv[:len(prog.split())]) == prog, (prog, line)  # an example of this command
            build = build_tune_parser if argv[0] == "tune" else build_parser
            build().parse_args(argv[1:])  # SystemExit (an unknown option) fails the test
    for prog in ("tasks", "compile", "bench", "run", "jobs", "report"):
        assert parsers[f"nightshift {prog}"].description, prog


def test_one_spelling_per_option():
    """compile skips its check with tune's --no-verify (--verify MODE still parses, unlisted);
    prune's --older-than takes a duration as tune's --time-budget does; durations everywhere."""
    from tuner.cli import build_parser, build_tune_parser

    parser = build_parser()
    compile_ = ["compile", "--model", "tiny", "-o", "t.so"]
    assert parser.parse_args(compile_).verify == "auto"
    assert parser.parse_args([*compile_, "--no-verify"]).verify == "off"
    assert parser.parse_args([*compile_, "--verify", "on"]).verify == "on"
    assert "--verify {" not in parser._subparsers._group_actions[0].choices["compile"].format_help()
    assert build_tune_parser().parse_args(["--no-verify"]).no_verify is True
    assert build_tune_parser().parse_args(["--build-timeout", "2m"]).build_timeout == 120.0
    assert parser.parse_args(["db", "prune", "--older-than", "30d"]).older_than == "30d"


def test_scheduler_option_reaches_the_tune_options():
    """--scheduler (the round-robin ablation of the task scheduler) goes from the command line
    into the job's options, gradient when not given; another name is refused."""
    from tuner.app.tune import TuneOptions
    from tuner.cli import build_tune_parser
    from tuner.config import apply_config

    def options(*argv: str) -> TuneOptions:
        args = build_tune_parser().parse_args(["--model", "tiny", *argv])
        apply_config(args)
        return TuneOptions.from_namespace(args, db="t.db")

    assert options("--scheduler", "round-robin").scheduler == "round-robin"
    assert options().scheduler == "gradient"
    with pytest.raises(SystemExit):
        build_tune_parser().parse_args(["--model", "tiny", "--scheduler", "fifo"])


def test_read_only_commands_import_neither_tvm_nor_torch(tmp_path):
    """nightshift jobs and db stats answer in well under a second: they import no TVM and no
    torch (seconds each). The check counts modules, not seconds, so a busy machine cannot fail it."""
    code = (
        "import sys\n"
        "from tuner import cli\n"
        f"db = {str(tmp_path / 't.db')!r}\n"
        "assert cli.main(['jobs', '--db', db]) == 0\n"
        "assert cli.main(['db', 'jobs', '--db', db]) == 0\n"
        "assert cli.main(['db', 'stats', '--db', db]) == 0\n"
        "heavy = sorted(m for m in ('tvm', 'torch', 'numpy', 'alembic') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    # Creating the schema loads alembic: in a process of its own.
    assert run("nightshift", "db", "init", "--db", "t.db", cwd=tmp_path).returncode == 0
    env = os.environ | {"COLUMNS": "80"}
    env.pop("NIGHTSHIFT_DB", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("no jobs in the database") == 2 and "0 workloads, 0 records" in proc.stdout


def test_tasks_total_counts_each_conv_once_across_its_layout_variants():
    """A conv tuned in NCHW, NCHW8c and Winograd runs once per inference: the total takes its
    costliest variant, not the sum of the alternatives (ResNet-50 printed ~3x its GFLOP)."""
    from tuner.cli.tasks import _total_line
    from tuner.graph.tasks import Task

    # mod is not read by the total (no IRModule needed for arithmetic on weights and FLOPs).
    conv = [Task("conv", None, 2, 1e9, "k1", "NCHW", "c0", 0), Task("conv8c", None, 2, 1e9, "k2", "NCHW8c", "c0", 1),
            Task("conv_w", None, 2, 0.4e9, "k3", "NCHW8c:w4", "c0", 2)]  # fmt: skip
    dense = Task("dense", None, 1, 0.5e9, "k4")
    line = _total_line([*conv, dense])
    assert line.startswith("total 2.50 GFLOP per inference")
    assert "3 tasks are layout variants of 1 convs" in line
    assert _total_line([dense]) == "total 0.50 GFLOP per inference"
    # A pooling of another layout plan's own (a mean reading NCHW beside the blocked one) runs
    # only where that plan is taken: counted in the first plan's sum, not beside it.
    means = [Task("mean", None, 1, 0.1e9, "k5", plans=(0,)), Task("mean[NCHW]", None, 1, 0.1e9, "k6", plans=(1,))]
    line = _total_line([*conv, dense, *means])
    assert line.startswith("total 2.60 GFLOP per inference") and "1 run only in another layout" in line
