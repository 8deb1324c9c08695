"""Does one runtime slow the next in interleaved rounds? TVM's int8 ResNet-50 and OpenVINO on
the same QDQ file, with and without ONNX Runtime in the rotation, with and without a pause.

The rounds are ``tuner.bench.interleave``'s (each runtime once per round, a warm-up run then a
timed one, the start rotating), with ``--settle`` seconds of sleep before each warm-up; the
runtimes are the benchmark's own peers (``openvino-f32``: OpenVINO with
``INFERENCE_PRECISION_HINT=f32``, so its float parts do not run in its bf16 default on CPUs with
AVX512_BF16 or AMX, and its int8 kernels where the file is quantized, as
``precision_vs_peers.py`` runs it; ``onnxruntime``). Each runtime's label and the precision it
reports are recorded.
``tuner.bench`` pauses 0.1 s since this script showed ONNX Runtime's threads slowing
OpenVINO after it (benchmarks/README.md, "The interleaved rounds favoured TVM"). With
``--back-to-back N`` each runtime first runs alone, N timed runs in a row after three warm-ups,
so its steady speed sits beside its speed in the rounds. Writes
benchmarks/results/runtime_interference.json (``--out``).

    .venv/bin/python benchmarks/runtime_interference.py --db /work/bench/r50_int8.db --with-onnxruntime --settle 0
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tuner.bench import TvmRunner, interleave, peer_model
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.peers import create
from tuner.precision.quantize import DEFAULT_CALIBRATION, quantized_model

sys.path.insert(0, str(Path(__file__).parent))
from result_file import write_result

RESULTS = Path(__file__).parent / "results" / "runtime_interference.json"


def back_to_back(runner, inputs: list[np.ndarray], runs: int) -> float:
    """The median milliseconds of ``runs`` runs in a row, after three warm-ups."""
    for _ in range(3):
        runner.run(inputs)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        runner.run(inputs)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="an int8 ResNet-50 tuning database")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--settle", type=float, default=0.0, help="seconds of sleep before each warm-up")
    p.add_argument("--with-onnxruntime", action="store_true", help="ONNX Runtime in the rotation too")
    p.add_argument("--back-to-back", type=int, default=0,
                   help="first time each runtime alone, this many runs in a row after three warm-ups")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    qdq = quantized_model(load_model("resnet50"), "resnet50", DEFAULT_CALIBRATION)
    spec = load_model(str(qdq))
    compiled = compile_model(spec, device, TuningDatabase(args.db), precision="int8")
    model = peer_model(spec, str(qdq), Path(tempfile.mkdtemp()))
    runners: dict = {"tvm": TvmRunner(compiled, device, "TVM, database", "int8")}
    for name in (["onnxruntime"] if args.with_onnxruntime else []) + ["openvino-f32"]:
        peer = create(name)
        peer.prepare(model, int(device.target_config.get("num-cores") or 1))  # as tuner.bench does
        runners[name] = peer
    inputs = spec.random_inputs()
    alone = {k: back_to_back(r, inputs, args.back_to_back) for k, r in runners.items()} if args.back_to_back else {}
    samples, order = interleave(runners, inputs, rounds=args.rounds, settle_s=args.settle)
    times = {k: [t * 1e3 for t in v] for k, v in samples.items()}
    medians = {k: float(np.median(v)) for k, v in times.items()}
    for k, v in times.items():
        print(f"{runners[k].label:32s} median {medians[k]:7.2f} ms, range {min(v):.1f}-{max(v):.1f}")
    print(f"TVM / OpenVINO: {medians['tvm'] / medians['openvino-f32']:.3f}")
    if alone:
        print("back to back: " + ", ".join(f"{runners[k].label} {v:.2f} ms" for k, v in alone.items())
              + f"; TVM / OpenVINO {alone['tvm'] / alone['openvino-f32']:.3f}")
    write_result(args.out, "runtime_interference", {
        "db": args.db, "rounds": args.rounds, "settle_s": args.settle, "with_onnxruntime": args.with_onnxruntime,
        "labels": {k: r.label for k, r in runners.items()},
        "precisions": {k: r.precision for k, r in runners.items()}, "medians_ms": medians, "samples_ms": times,
        "order": order, "back_to_back_runs": args.back_to_back, "back_to_back_medians_ms": alone,
    })  # fmt: skip


if __name__ == "__main__":
    main()
