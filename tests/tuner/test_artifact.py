"""The job's artifact: written by tune -o, verified, loaded with TVM's runtime alone, run by nightshift run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from morning_job import one_line_error, run, tiny_job

# Each compiles a model and runs it in processes of its own: seconds to tens of seconds.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return tiny_job(tmp_path_factory)


def _input(meta: dict) -> np.ndarray:
    (spec,) = meta["inputs"]
    return np.random.default_rng(7).standard_normal(spec["shape"]).astype(spec["dtype"])


def test_metadata_says_what_the_artifact_is(job):
    meta = json.loads((job / "tiny.json").read_text())
    assert meta["format"] == "nightshift-artifact/1" and meta["library"] == "tiny.so"
    assert meta["model"] == "tiny" and meta["source"] == "tiny"
    assert len(meta["device"]["fingerprint"]) == 16 and meta["device"]["kind"] == "cpu"
    assert meta["device"]["threads"] >= 1
    (inp,) = meta["inputs"]
    assert inp["dtype"] == "float32" and len(inp["shape"]) == 4
    assert meta["outputs"] and meta["outputs"][0]["dtype"] == "float32"
    ops = meta["operators"]
    # Every fused operator got something, and the job's tuned tasks were found in the database.
    assert ops["tuned"] >= 1 and sum(ops.values()) >= len(meta["tasks"]) - 1
    assert all(t["weight"] >= 1 and t["workload_key"] for t in meta["tasks"])
    v = meta["verification"]
    assert v["reference"] == "untuned TVM build" and v["ok"] and 0 <= v["max_error"] <= v["tolerance"]
    assert meta["latency_ms"] > 0 and meta["untuned_latency_ms"] > 0
    # The latency's spread and method, and what it was judged against (tuned / baseline).
    assert meta["latency"]["median_ms"] == pytest.approx(meta["latency_ms"])
    assert "median of" in meta["latency"]["method"]
    fallback = meta["baselines"]["tvm-fallback"]
    assert fallback["ratio"] == pytest.approx(meta["latency_ms"] / fallback["median_ms"])
    assert meta["job"]["id"] == 1
    assert "wrote tiny.so" in (job / "tune.out").read_text()


def test_loads_with_the_runtime_alone(job, tmp_path):
    """TVM_USE_RUNTIME_LIB=1 loads libtvm_runtime only: the artifact needs no compiler."""
    meta = json.loads((job / "tiny.json").read_text())
    np.save(tmp_path / "x.npy", _input(meta))
    log = tmp_path / "debug.log"
    code = (
        "import sys; from pathlib import Path; import numpy as np\n"
        # As a user's program that logs to a file: TVM's per-load "Scope Loaded" lines go there.
        f"import logging; logging.basicConfig(level=logging.DEBUG, filename={str(log)!r})\n"
        "from tuner.artifact import load_artifact\n"
        "import tvm.base\n"
        f"a = load_artifact(Path({str(job / 'tiny.so')!r}))\n"
        f"out = a.run([np.load({str(tmp_path / 'x.npy')!r})])\n"
        "maps = Path('/proc/self/maps').read_text()\n"
        "print('runtime_only', tvm.base._RUNTIME_ONLY, 'compiler', 'libtvm_compiler' in maps, 'runtime',"
        " 'libtvm_runtime' in maps, 'shape', out[0].shape)\n"
        "import tvm.runtime; print('threads', tvm.get_global_func('runtime.NumThreads')())\n"
    )
    env = os.environ | {"TVM_USE_RUNTIME_LIB": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # TVM's C++ warnings on the load reach the program's log at DEBUG, not its terminal.
    assert "Scope" not in proc.stderr, proc.stderr
    assert "executable.cc" in log.read_text() and "Scope Loaded" in log.read_text()
    shape = tuple(meta["outputs"][0]["shape"])
    assert f"runtime_only True compiler False runtime True shape {shape}" in proc.stdout
    # On the threads it was tuned on: config_threadpool without a CPU list kept one thread.
    assert f"threads {meta['device']['threads']}" in proc.stdout
    # So does the command line.
    proc = run("nightshift", "run", str(job / "tiny.so"), "--input", "x.npy", "--output", "y.npy", cwd=tmp_path,
               env={"TVM_USE_RUNTIME_LIB": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Scope" not in proc.stderr, proc.stderr  # quiet by default; -v shows them
    assert np.load(tmp_path / "y.npy").shape == shape


def test_run_matches_the_untuned_build_and_times(job, tmp_path):
    from tuner.compile import compile_model, run_model
    from tuner.device import parse_device
    from tuner.frontends import load_model

    meta = json.loads((job / "tiny.json").read_text())
    x = _input(meta)
    np.save(tmp_path / "x.npy", x)
    # --repeat and --threads: the old names of --rounds and --num-cores, still accepted.
    proc = run("nightshift", "run", str(job / "tiny.so"), "--input", "x.npy", "--output", "y.npy",
               "--repeat", "5", "--threads", "1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "wrote y.npy" in proc.stdout and "latency over 5 runs: p50 " in proc.stdout
    assert "(median of 5 runs, IQR " in proc.stdout
    ms = float(proc.stdout.split("p50 ")[1].split(" ms")[0])
    assert ms > 0
    y = np.load(tmp_path / "y.npy")
    # The same input through TVM's default build of the same model, in this process.
    device = parse_device("cpu")
    base = compile_model(load_model("tiny"), device, None)
    (ref,), _ = run_model(base, device, [x], budget_s=0.1)
    assert np.max(np.abs(ref - y)) <= 1e-2 * max(float(np.max(np.abs(ref))), 1e-6)
    # An .npz keyed by the input's name works too.
    np.savez(tmp_path / "in.npz", **{meta["inputs"][0]["name"]: x})
    proc = run("nightshift", "run", str(job / "tiny.so"), "--input", "in.npz", "--output", "z.npy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "z.npy"), y)


def test_run_random_input_reports_percentiles_and_throughput(job, tmp_path):
    proc = run("nightshift", "run", str(job / "tiny.so"), "--random-input", "--rounds", "20", "--num-cores", "1",
               "--output", "r.npy", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((job / "tiny.json").read_text())
    (inp,) = meta["inputs"]
    assert f"random inputs: {inp['name']} {tuple(inp['shape'])} {inp['dtype']}" in proc.stdout
    stats = proc.stdout.split("latency over 20 runs: ")[1]
    p50, p90, p99 = (float(stats.split(f"{p} ")[1].split(" ms")[0]) for p in ("p50", "p90", "p99"))
    assert 0 < p50 <= p90 <= p99
    mean, spread = (float(v) for v in stats.split("mean ")[1].split(" ms (std")[0].split(" ms ± "))
    assert mean > 0 and spread >= 0
    assert float(stats.split("throughput ")[1].split(" inferences/s")[0].replace(",", "")) > 0
    assert np.load(tmp_path / "r.npy").shape == tuple(meta["outputs"][0]["shape"])


def test_bad_input_is_one_line_and_exit_2(job, tmp_path):
    meta = json.loads((job / "tiny.json").read_text())
    x = _input(meta)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "wrong_shape.npy", x[..., :-1])
    np.save(tmp_path / "wrong_dtype.npy", x.astype(np.float64))
    (tmp_path / "junk.npy").write_text("not numpy")
    np.savez(tmp_path / "other.npz", other=x)
    lib = str(job / "tiny.so")
    cases = [
        ([lib, "--input", "wrong_shape.npy"], "expected shape"),
        ([lib, "--input", "wrong_dtype.npy"], "float64"),
        ([lib, "--input", "missing.npy"], "no such file"),
        ([lib, "--input", "junk.npy"], "not a .npy"),
        ([lib, "--input", "other.npz"], "no array named"),
        ([lib, "--input", "x.npy", "--input", "x.npy"], "takes 1 input"),
        ([lib, "--input", "x.npy", "--output", "no/such/dir/y.npy"], "does not exist"),
        ([lib, "--input", "x.npy", "--rounds", "-1"], "--rounds"),
        ([str(tmp_path / "nothing.so"), "--input", "x.npy"], "no artifact"),
    ]
    for args, expect in cases:
        assert expect in one_line_error(run("nightshift", "run", *args, cwd=tmp_path)), args
    # A library without its metadata, and metadata beside a missing library.
    (tmp_path / "lonely.so").write_bytes((job / "tiny.so").read_bytes())
    assert "metadata" in one_line_error(run("nightshift", "run", "lonely.so", "--input", "x.npy", cwd=tmp_path))
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "metadata.json").write_text((job / "tiny.json").read_text())
    assert "library" in one_line_error(run("nightshift", "run", "art", "--input", "x.npy", cwd=tmp_path))
