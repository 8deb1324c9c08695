"""benchmarks/summary.py: the model suite's rows and its table of its own."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.bench_scripts import load_script


def _run(model: str, tvm_ms: float, peers: dict[str, float], ok: bool = True) -> dict:
    entries = [{"key": "tvm", "kind": "tvm", "precision": "f32", "status": "ok", "median_ms": tvm_ms}]
    entries += [
        {"key": k, "kind": "peer", "precision": "f32", "status": "ok", "median_ms": v} for k, v in peers.items()
    ]
    fastest = min(peers.values())
    return {"model": model, "source": f"torchvision:{model}", "tvm_ms": tvm_ms, "output_ok": ok,
            "tune": {"exit_code": 0, "wall_s": 300.0, "trials": 512},
            "bench": {"device": {"arch": "znver5", "fingerprint": "f"}, "entries": entries},
            **{f"ratio_vs_{k}": tvm_ms / v for k, v in peers.items()},
            "ratio_vs_fastest_peer": tvm_ms / fastest, "max_error_vs_reference": 1e-7,
            "input_sensitivity": 1e-3}  # fmt: skip


@pytest.fixture()
def summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = load_script("summary")
    results = tmp_path / "results"
    results.mkdir()
    doc = {"benchmark": "model_suite", "date": "2026-12-02T10:00:00+00:00", "command": "model_suite.py --trials 512",
           "budget": ["--trials", "512"],
           "models": [_run("a", 2.0, {"onnxruntime": 4.0, "openvino-f32": 2.5}) | {"peer_mismatches": ["onnxruntime"]},
                      _run("b", 3.0, {"onnxruntime": 2.0, "openvino-f32": 2.5}),
                      _run("c", 1.0, {"onnxruntime": 4.0, "openvino-f32": 4.0}, ok=False),
                      {"model": "d", "tune": {"exit_code": 2, "error": "cannot import"}}],
           "summary": {"tune_failures": 1, "wrong_outputs": 1}}  # fmt: skip
    (results / "model_suite_512trials_znver5.json").write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{module.START}\n{module.END}\ny\n{module.SUITE_START}\n{module.SUITE_END}\n"
                      f"{module.TTQ_START}\n{module.TTQ_END}\n")
    perf = tmp_path / "performance.md"
    perf.write_text(f"{module.START}\n{module.END}\n")
    monkeypatch.setattr(module, "README", readme)
    monkeypatch.setattr(module, "PERFORMANCE", perf)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module, results, readme


def test_suite_rows_join_the_summary_except_a_wrong_output(summary) -> None:
    module, results, _ = summary
    rows = {r.model: r for r in module.load(results)}
    assert set(rows) == {"a", "b"}  # c's output was wrong, d did not tune
    assert rows["a"].peer == "OpenVINO f32" and rows["a"].trials == "512"
    assert rows["b"].ratio == pytest.approx(1.5)
    # A peer whose output was wrong is no reference: b against OpenVINO alone.
    doc = json.loads((results / "model_suite_512trials_znver5.json").read_text())
    next(e for e in doc["models"][1]["bench"]["entries"] if e["key"] == "onnxruntime")["agrees"] = False
    (results / "model_suite_512trials_znver5.json").write_text(json.dumps(doc))
    assert {r.model: r for r in module.load(results)}["b"].ratio == pytest.approx(1.2)


def test_the_suite_table_has_every_model_and_the_geomean_of_the_right_ones(summary) -> None:
    module, results, readme = summary
    assert module.main(["--results", str(results)]) == 0
    text = readme.read_text()
    block = text[text.index(module.SUITE_START) : text.index(module.SUITE_END)]
    lines = [ln for ln in block.splitlines() if ln.startswith("| ")]
    assert [ln.split(" | ")[0][2:] for ln in lines[1:]] == ["a", "b", "c", "d"]
    assert "tune failed" in lines[4] and "wrong" in lines[3]
    assert "**0.80x**" in lines[1]  # a: 2.0 ms against OpenVINO's 2.5
    assert "0.50x (peer wrong)" in lines[1] and "peer wrong" not in lines[2]  # a's ONNX Runtime output differed
    assert f"geometric mean {math.sqrt(0.8 * 1.5):.2f}x" in block and "worst 1.50x" in block
    assert module.main(["--results", str(results), "--check"]) == 0
    (results / "model_suite_512trials_znver5.json").write_text(
        (results / "model_suite_512trials_znver5.json").read_text().replace('"tvm_ms": 2.0', '"tvm_ms": 2.2')
    )
    assert module.main(["--results", str(results), "--check"]) == 1


def test_the_two_suite_budgets_keep_a_row_each_and_a_newer_run_replaces_its_own(summary) -> None:
    module, results, _ = summary
    doc = {"benchmark": "model_suite", "date": "2026-12-03T10:00:00+00:00", "budget": ["--time-budget", "20m"],
           "models": [_run("a", 1.5, {"onnxruntime": 4.0, "openvino-f32": 2.5})]}  # fmt: skip
    (results / "model_suite_20m_znver5.json").write_text(json.dumps(doc))
    newer = {**doc, "date": "2026-12-04T10:00:00+00:00", "budget": ["--trials", "512"],
             "models": [_run("a", 2.4, {"onnxruntime": 4.0, "openvino-f32": 2.5})]}  # fmt: skip
    (results / "model_suite_512trials_znver5_rerun.json").write_text(json.dumps(newer))
    rows = [r for r in module.latest(module.load(results), by_benchmark=False) if r.model == "a"]
    assert {r.trials: r.tvm_ms for r in rows} == {"20 min": 1.5, "512": 2.4}


def test_the_time_to_quality_table_has_a_row_per_model_and_arm(summary) -> None:
    module, results, readme = summary
    rows = [{"budget": 64, "seeds": 2, "ratio_mean": 1.5, "ratio_min": 1.4, "ratio_max": 1.6, "trials_mean": 64,
             "tuning_min_mean": 1.0, "tvm_ms_mean": 3.0}]  # fmt: skip
    doc = {"benchmark": "time_to_quality", "date": "2026-12-07T10:00:00+00:00", "command": "time_to_quality.py",
           "peers": ["onnxruntime", "openvino-f32"],
           "machine": {"target": json.dumps({"kind": "llvm", "mcpu": "znver3"})},
           "summary": {"m": {"peer_ms_median": 2.0, "arms": {
               "random": rows, "evo-online": [rows[0] | {"budget": 128, "seeds": 1, "ratio_mean": 1.1}]}}}}  # fmt: skip
    (results / "time_to_quality_znver3.json").write_text(json.dumps(doc))
    assert module.main(["--results", str(results)]) == 0
    text = readme.read_text()
    block = text[text.index(module.TTQ_START) : text.index(module.TTQ_END)]
    lines = [ln for ln in block.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| model | arm | 64 trials | 128 trials |" and "`znver3`" in block
    assert lines[1] == "| m | random | 1.50x (1.40-1.60), 1.0 min | - |"
    assert lines[2] == "| m | evo-online | - | 1.10x, 1.0 min |"
    assert "ONNX Runtime, OpenVINO f32" in block
    assert module.main(["--results", str(results), "--check"]) == 0


def test_a_resumed_suite_file_names_every_command_that_wrote_it(summary) -> None:
    module, results, readme = summary
    path = results / "model_suite_512trials_znver5.json"
    doc = json.loads(path.read_text()) | {"earlier_commands": ["model_suite.py --trials 512 --models a"],
                                          "command": "model_suite.py --trials 512 --resume --models b"}  # fmt: skip
    path.write_text(json.dumps(doc))
    assert module.main(["--results", str(results)]) == 0
    text = readme.read_text()
    block = text[text.index(module.SUITE_START) : text.index(module.SUITE_END)]
    assert "`model_suite.py --trials 512 --models a`; then `model_suite.py --trials 512 --resume --models b`" in block
