"""``nightshift bench`` with real runtimes: TVM builds, ONNX Runtime, OpenVINO and PyTorch on ``tiny``."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tuner.bench import TVM_DB, BenchConfig, TvmRunner, bench, export_onnx, interleave, peer_model, render
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.frontends.zoo import tiny
from tuner.peers import PEERS, OnnxRuntimePeer, PeerModel, create

pytest.importorskip("onnxruntime")


class NotInstalledPeer(OnnxRuntimePeer):
    """A peer whose runtime is genuinely absent: the harness must list it as skipped."""

    name = "not-installed"
    module = "nightshift_no_such_runtime"
    install = "pip install nightshift-no-such-runtime"


@pytest.fixture(scope="module")
def device():
    return parse_device("cpu", num_cores=2)


@pytest.fixture(scope="module")
def spec():
    return tiny()


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory):
    db = TuningDatabase(str(tmp_path_factory.mktemp("bench") / "empty.db"))
    yield db
    db.close()


@pytest.fixture(scope="module")
def result(spec, device, empty_db):
    """One benchmark of tiny (fallback build: the database is empty) against the installed peers."""
    peers = ("onnxruntime", "openvino-f32", "openvino", "torch", NotInstalledPeer())
    return bench(spec, device, empty_db, source="tiny", config=BenchConfig(rounds=3, peers=peers))


def test_peers_agree_with_tvm(result):
    ran = [e for e in result.entries if e.status == "ok"]
    keys = {e.key for e in ran}
    assert {TVM_DB, "onnxruntime"} <= keys
    assert result.reference == "onnxruntime"  # the first f32 peer
    for e in ran:
        assert e.agrees, (e.key, e.max_error)
        assert len(e.samples_s) == 3 and all(s > 0 for s in e.samples_s)
    # The same network, not just the same shapes: f32 runtimes agree to rounding.
    for e in ran:
        if e.precision == "f32":
            assert e.max_error < 1e-4, (e.key, e.max_error)
    assert result.ok
    assert result.fastest_peer in keys
    assert result.ratio(result.entry(result.fastest_peer)) == pytest.approx(1.0)


def test_openvino_rows_report_their_precision(result):
    pytest.importorskip("openvino")
    f32, default = result.entry("openvino-f32"), result.entry("openvino")
    assert f32.status == default.status == "ok", (f32.reason, default.reason)
    assert f32.precision == "f32"
    assert default.precision in default.label and default.precision in {"f32", "bf16", "f16"}


def test_missing_peer_is_skipped_with_install_command(result):
    e = result.entry("not-installed")
    assert e.status == "skipped" and "not installed" in e.reason
    assert e.install == "pip install nightshift-no-such-runtime"
    assert not e.samples_s and e.agrees is None
    assert result.ok  # a skipped peer is not a failure


def test_rounds_alternate(result):
    ran = {e.key for e in result.entries if e.status == "ok"}
    assert len(result.order) == 3
    for this_round in result.order:
        assert sorted(this_round) == sorted(ran)  # every runtime once per round
    assert len({r[0] for r in result.order}) == 3  # a different one starts each round


def test_json_fields(result, tmp_path):
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["model"] == "tiny" and doc["threads"] == 2 and doc["rounds"] == 3
    assert {"name", "arch", "fingerprint"} <= set(doc["device"])
    assert doc["reference"] == "onnxruntime" and doc["ok"] is True
    by_key = {e["key"]: e for e in doc["entries"]}
    row = by_key["onnxruntime"]
    for field in ("label", "kind", "precision", "status", "median_ms", "min_ms", "spread",
                  "ratio_to_fastest_peer", "per_round_ratio_to_fastest_peer", "rounds_faster_than_fastest_peer",
                  "max_error", "agrees", "samples_ms", "p25_ms", "p75_ms"):  # fmt: skip
        assert field in row
    assert row["p25_ms"] <= row["median_ms"] <= row["p75_ms"] and "median of 3" in doc["timing"]
    assert row["kind"] == "peer" and len(row["samples_ms"]) == 3
    assert by_key[TVM_DB]["kind"] == "tvm" and by_key[TVM_DB]["median_ms"] > 0
    assert by_key["not-installed"]["status"] == "skipped" and by_key["not-installed"]["median_ms"] is None
    table = render(result)
    assert table.row_count == len(result.entries)
    assert str(table.title).endswith(f"'x peer' is x of {result.entry(result.fastest_peer).label}, lower is better")
    assert "median of 3 interleaved rounds (each run copies the inputs in and the outputs out)" in str(table.title)
    # A run whose peers all ran at another precision (bf16 peers only) has no f32 peer to divide by.
    assert str(render(dataclasses.replace(result, fastest_peer=None)).title).endswith("no ratios: no f32 peer ran")
    # An 80-column terminal: no line of the table runs over, the notes go below it.
    from rich.console import Console

    console = Console(width=80, record=True, file=io.StringIO())
    console.print(table)
    printed = console.export_text()
    assert max(len(line) for line in printed.splitlines()) <= 80 and "not-installed: skipped" in printed


def test_the_per_round_ratio_pairs_each_round_with_the_fastest_peers(result):
    doc = result.to_json()
    by_key = {e["key"]: e for e in doc["entries"]}
    peer = by_key[doc["fastest_peer"]]
    assert peer["per_round_ratio_to_fastest_peer"] == 1.0 and peer["rounds_faster_than_fastest_peer"] == 0
    tvm = by_key[TVM_DB]
    ratios = [a / b for a, b in zip(tvm["samples_ms"], peer["samples_ms"], strict=True)]
    assert tvm["per_round_ratio_to_fastest_peer"] == pytest.approx(float(np.median(ratios)))
    assert tvm["rounds_faster_than_fastest_peer"] == sum(r < 1 for r in ratios)
    assert by_key["not-installed"]["per_round_ratio_to_fastest_peer"] is None
    # Rounds that paired a fast stretch of one with a slow one of the other: the medians'
    # ratio says 1.5x, each round says 1.0x.
    swings = dataclasses.replace(result, entries=[
        dataclasses.replace(e, samples_s=[0.010, 0.010, 0.020]) if e.key == result.fastest_peer
        else dataclasses.replace(e, samples_s=[0.010, 0.015, 0.020]) if e.key == TVM_DB else e
        for e in result.entries])  # fmt: skip
    paired = swings.paired_ratio(swings.entry(TVM_DB))
    assert swings.ratio(swings.entry(TVM_DB)) == pytest.approx(1.5)
    assert paired is not None and paired.median == pytest.approx(1.0) and (paired.faster, paired.rounds) == (0, 3)
    assert "1.00x (0/3)" in _cells(render(swings))


def _cells(table) -> list[str]:
    return [str(cell) for column in table.columns for cell in column._cells]


class Recorder:
    """Wraps a real runner and logs each call, to see the order the harness runs them in."""

    def __init__(self, key: str, runner, log: list[str]) -> None:
        self.key, self.runner, self.log = key, runner, log
        self.label, self.precision = runner.label, runner.precision

    def run(self, inputs):
        self.log.append(self.key)
        return self.runner.run(inputs)


def test_interleave_alternates_real_runtimes(spec, device, empty_db, tmp_path):
    compiled = compile_model(spec, device, empty_db)
    model = peer_model(spec, "tiny", tmp_path)
    ort = create("onnxruntime")
    ort.prepare(model, 2)
    log: list[str] = []
    runners = {"tvm": Recorder("tvm", TvmRunner(compiled, device, "tvm"), log), "ort": Recorder("ort", ort, log)}
    samples, order = interleave(runners, spec.random_inputs(), rounds=3, warmup=1)
    # Warm-up then timed run per runtime; the starting runtime rotates.
    assert log == ["tvm", "tvm", "ort", "ort", "ort", "ort", "tvm", "tvm", "tvm", "tvm", "ort", "ort"]
    assert order == [["tvm", "ort"], ["ort", "tvm"], ["tvm", "ort"]]
    assert all(len(s) == 3 for s in samples.values())


def test_interleave_lets_the_previous_runtime_settle():
    """Between one runtime's timed run and the next one's warm-up, ``settle_s`` of idle time.
    (The runners only record when they are called: this test is about the harness's order
    and pauses, not about any runtime.)"""

    class Clock:
        def __init__(self, calls: list[tuple[str, float]], key: str) -> None:
            self.calls, self.key = calls, key

        def run(self, inputs):
            self.calls.append((self.key, time.perf_counter()))

    calls: list[tuple[str, float]] = []
    interleave({k: Clock(calls, k) for k in ("a", "b")}, [], rounds=2, warmup=1, settle_s=0.05,
               before_round=lambda r: calls.append((f"round {r}", time.perf_counter())))  # fmt: skip
    assert [k for k, _ in calls] == ["round 0", "a", "a", "b", "b", "round 1", "b", "b", "a", "a"]
    calls = [c for c in calls if not c[0].startswith("round")]
    for (before, t0), (after, t1) in itertools.pairwise(calls):
        if before != after:
            assert t1 - t0 >= 0.05


def test_onnx_file_reaches_peers_as_is(spec, device, empty_db, tmp_path):
    """An ONNX model: TVM imports the file, ONNX Runtime reads the same file, torch has nothing to run."""
    pytest.importorskip("torch")
    from tuner.peers.torch_zoo import torch_zoo_model

    path = tmp_path / "tiny_export.onnx"
    export_onnx(torch_zoo_model(spec), spec.random_inputs(), ["x"], path)
    onnx_spec = load_model(str(path))
    res = bench(onnx_spec, device, empty_db, source=str(path),
                config=BenchConfig(rounds=2, peers=("onnxruntime", "torch")))  # fmt: skip
    assert res.entry("onnxruntime").agrees and res.entry(TVM_DB).agrees
    assert res.entry(TVM_DB).max_error < 1e-4
    torch_row = res.entry("torch")
    assert torch_row.status == "skipped" and "ONNX model" in torch_row.reason


def test_an_ecosystem_model_reaches_the_peers_through_its_module(device, empty_db):
    """hf:/torchvision:/timm: models and PyTorch programs: torch runs the module the frontend
    exported, ONNX Runtime its ONNX export, and both agree with TVM (token ids and a mask in)."""
    pytest.importorskip("transformers")
    from tuner.frontends.ecosystem import load_ecosystem

    tiny = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100}
    spec = load_ecosystem("hf:gpt2", seq_len=8, hf_config=tiny)
    res = bench(spec, device, empty_db, source="hf:gpt2",
                config=BenchConfig(rounds=2, fallback=False, peers=("onnxruntime", "torch")))  # fmt: skip
    for key in ("onnxruntime", "torch", TVM_DB):
        assert res.entry(key).status == "ok", res.entry(key).reason
    assert res.entry("torch").agrees and res.entry(TVM_DB).agrees


def test_torch_twin_fails_loudly_on_a_wrong_parameter(spec):
    pytest.importorskip("torch")
    from tuner.frontends.model import ModelSpec
    from tuner.peers.torch_zoo import torch_zoo_model

    params = dict(spec.params)
    params["fc.weights"] = params.pop("fc.weight")
    with pytest.raises(RuntimeError, match=r"fc\.weight"):
        torch_zoo_model(ModelSpec(spec.name, spec.mod, params))


@pytest.mark.slow
def test_torch_compile_matches_eager(spec, tmp_path):
    """torch.compile runs (it needs a C++ compiler) and computes what eager mode does."""
    pytest.importorskip("torch")
    model: PeerModel = peer_model(spec, "tiny", tmp_path)
    inputs = spec.random_inputs()
    eager, compiled = create("torch"), create("torch.compile")
    eager.prepare(model, 2)
    compiled.prepare(model, 2)
    a, b = eager.run(inputs), compiled.run(inputs)
    assert len(a) == len(b) == 1
    np.testing.assert_allclose(b[0], a[0], rtol=1e-4, atol=1e-5)
    assert "torch.compile" in compiled.label


def test_registry_names_and_unknown_peer():
    assert list(PEERS) == ["onnxruntime", "openvino-f32", "openvino", "torch", "torch.compile"]
    with pytest.raises(ValueError, match="onnxruntime"):
        create("tensorrt")


def test_cli_bench_writes_json(tmp_path: Path):
    from tuner.cli import main

    out = tmp_path / "bench.json"
    TuningDatabase(str(tmp_path / "t.db")).close()  # only tune and db init create a database
    rc = main(["bench", "--model", "tiny", "--db", str(tmp_path / "t.db"), "--json", str(out), "--rounds", "2",
               "--peers", "onnxruntime", "--num-cores", "2"])  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [e["key"] for e in doc["entries"]] == [TVM_DB, "onnxruntime"]
    assert all(e["agrees"] for e in doc["entries"])
    # --layout auto on a database without records: the target's default plan, said so.
    choice = doc["layout_choice"]
    assert choice["plan"] == doc["layout_plan"] and choice["estimated_ms"] is None
    assert len(choice["convs"]) == 2 and set(choice["candidates_ms"].values()) == {None}


@pytest.mark.parametrize(("name", "options"), [
    ("resnet18", {"image_size": 32}),
    ("mobilenet_v2", {"image_size": 32}),
    ("bert-base", {"seq_len": 8}),
])  # fmt: skip
@pytest.mark.slow
def test_torch_twin_computes_what_the_zoo_does(name, options, device):
    """Each zoo network rebuilt in PyTorch gives TVM's output on the same weights (small inputs)."""
    torch = pytest.importorskip("torch")
    from tuner.frontends.zoo import build_zoo_model
    from tuner.peers.torch_zoo import torch_zoo_model

    zoo = build_zoo_model(name, **options)
    inputs = zoo.random_inputs(seed=1)
    expected = TvmRunner(compile_model(zoo, device, None), device, "tvm").run(inputs)
    with torch.inference_mode():
        got = torch_zoo_model(zoo)(*(torch.from_numpy(x) for x in inputs)).numpy()
    from tuner.bench import scaled_max_error

    assert scaled_max_error(expected, [got]) < 1e-4


def test_closing_comparison_for_tune(spec, device, empty_db):
    """tune's closing rows: nothing tuned, so no separate fallback row; the faster quick peer."""
    from tuner.bench import QUICK_PEERS, closing_comparison

    compiled = compile_model(spec, device, empty_db)
    row = closing_comparison(spec, device, empty_db, compiled, source="tiny",
                             config=BenchConfig(rounds=2, peers=QUICK_PEERS))  # fmt: skip
    assert row.fallback is None and row.agree
    assert row.peer is not None and row.peer > 0 and row.tuned > 0
    assert row.peer_label.startswith(("ONNX Runtime", "OpenVINO"))
    assert row.summary.startswith(f"tuned build: {row.tuned / row.peer:.2f}x of {row.peer_label} (lower is better")
    assert row.tuned_stats is not None and row.tuned_stats.runs == 2 and row.peer_stats is not None
    assert row.fallback_stats is None
    missing = closing_comparison(spec, device, empty_db, compiled, source="tiny",
                                 config=BenchConfig(rounds=1, peers=(NotInstalledPeer(),)))  # fmt: skip
    assert missing.peer is None and "not installed" in missing.summary
    assert "pip install -e '.[bench]'" in missing.summary


def test_a_different_network_is_caught(spec, device, empty_db, tmp_path):
    """A peer fed other weights than TVM's disagrees, and the result is not ok."""
    pytest.importorskip("torch")
    from tuner.frontends.model import ModelSpec
    from tuner.peers.torch_zoo import torch_zoo_model

    other = ModelSpec(spec.name, spec.mod, {k: v * np.float32(1.1) for k, v in spec.params.items()})
    path = tmp_path / "other.onnx"
    export_onnx(torch_zoo_model(other), spec.random_inputs(), ["x"], path)
    res = bench(spec, device, empty_db, source=str(path), config=BenchConfig(rounds=1, peers=("onnxruntime",)))
    assert res.entry(TVM_DB).agrees is False and res.entry(TVM_DB).max_error > 1e-2
    assert not res.ok


class OtherNetworkPeer(OnnxRuntimePeer):
    """ONNX Runtime on another network than the one asked for: what a peer that computes the
    model wrongly looks like (OpenVINO on the onnx wheel's light_squeezenet did)."""

    name = "other-network"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.label = "ORT on another network"

    def prepare(self, model: PeerModel, threads: int) -> None:
        super().prepare(dataclasses.replace(model, onnx_path=self.path), threads)
        self.label = "ORT on another network"


def test_a_peer_that_disagrees_is_the_peers_fault(spec, device, empty_db, tmp_path):
    """TVM agrees with the reference peer and a second peer does not: the result stays ok,
    the mismatch is named, and the wrong peer is no speed reference."""
    pytest.importorskip("torch")
    from tuner.bench import closing_comparison
    from tuner.frontends.model import ModelSpec
    from tuner.peers.torch_zoo import torch_zoo_model

    other = ModelSpec(spec.name, spec.mod, {k: v * np.float32(1.1) for k, v in spec.params.items()})
    path = tmp_path / "other.onnx"
    export_onnx(torch_zoo_model(other), spec.random_inputs(), ["x"], path)
    config = BenchConfig(rounds=2, peers=("onnxruntime", OtherNetworkPeer(path)))
    res = bench(spec, device, empty_db, source="tiny", config=config)
    assert res.reference == "onnxruntime" and res.entry(TVM_DB).agrees is True
    assert res.entry("other-network").agrees is False
    assert res.ok and [e.key for e in res.peer_mismatches] == ["other-network"]
    assert res.fastest_peer == "onnxruntime"
    assert res.to_json()["peer_mismatches"] == ["other-network"]
    (line,) = res.mismatch_warnings()
    assert line.startswith("ORT on another network's output differs from ONNX Runtime")
    closing = closing_comparison(spec, device, empty_db, compile_model(spec, device, empty_db), source="tiny",
                                 config=config)  # fmt: skip
    assert closing.agree and closing.peer_key == "onnxruntime" and closing.peer_mismatches == (line,)


def test_cli_rejects_bad_rounds(tmp_path):
    from tuner.cli import main

    assert main(["bench", "--model", "tiny", "--db", str(tmp_path / "t.db"), "--rounds", "0"]) == 2
    assert main(["bench", "--model", "tiny", "--db", str(tmp_path / "t.db"), "--json", "/no/such/dir/b.json"]) == 2


def test_a_precision_the_cpu_lacks_runs_the_peers_alone(spec, empty_db, tmp_path):
    """A Haswell target (AVX2, no AVX512_BF16) for bf16, a Sandy Bridge (AVX, no AVX2) for
    int8: TVM's row is skipped with the missing feature named, nothing is compiled, and the
    peers still run and are timed. On the QDQ file the two runtimes' int8 outputs differ by
    rounding, which is not a mismatch."""
    from tuner.precision.quantize import quantized_model

    haswell = parse_device("cpu", target_arch="haswell", num_cores=2)
    res = bench(spec, haswell, empty_db, source="tiny",
                config=BenchConfig(rounds=2, peers=("onnxruntime",), precision="bf16"))  # fmt: skip
    tvm = res.entry(TVM_DB)
    assert tvm.status == "skipped" and "avx512bf16" in tvm.reason and not tvm.samples_s
    assert [e.key for e in res.entries] == [TVM_DB, "onnxruntime"]
    assert len(res.entry("onnxruntime").samples_s) == 2 and res.fastest_peer == "onnxruntime"
    assert "skipped" in json.dumps(res.to_json())

    qdq = quantized_model(spec, "tiny", 4, directory=tmp_path)
    sandybridge = parse_device("cpu", target_arch="sandybridge", num_cores=2)
    res = bench(load_model(str(qdq)), sandybridge, empty_db, source=str(qdq),
                config=BenchConfig(rounds=2, peers=("onnxruntime", "openvino-f32"), precision="int8"))  # fmt: skip
    assert "avx512vnni" in res.entry(TVM_DB).reason
    ov = res.entry("openvino-f32")
    assert ov.samples_s and ov.max_error is not None and ov.agrees, ov.max_error
