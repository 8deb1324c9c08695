"""Does one runtime slow the next in interleaved rounds? TVM's int8 ResNet-50 and OpenVINO on
the same QDQ file, with and without ONNX Runtime in the rotation, with and without a pause.

Each round runs every runtime once (a warm-up run, then a timed one), rotating which starts;
``--settle`` seconds of sleep before each warm-up. ``tuner.bench`` pauses 0.1 s since this
script showed ONNX Runtime's threads slowing OpenVINO after it (benchmarks/README.md, "The
interleaved rounds favoured TVM"). Writes benchmarks/results/runtime_interference.json
(``--out``).

    .venv/bin/python benchmarks/runtime_interference.py --db /work/bench/r50_int8.db --with-onnxruntime --settle 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.precision.quantize import DEFAULT_CALIBRATION, quantized_model

sys.path.insert(0, str(Path(__file__).parent))
from result_file import write_result

RESULTS = Path(__file__).parent / "results" / "runtime_interference.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="an int8 ResNet-50 tuning database")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--settle", type=float, default=0.0, help="seconds of sleep before each warm-up")
    p.add_argument("--with-onnxruntime", action="store_true", help="ONNX Runtime in the rotation too")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    import onnxruntime as ort
    import openvino as ov

    device = parse_device("cpu")
    qdq = quantized_model(load_model("resnet50"), "resnet50", DEFAULT_CALIBRATION)
    spec = load_model(str(qdq))
    compiled = compile_model(spec, device, TuningDatabase(args.db), precision="int8")
    device.use_threads()
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    inputs = spec.random_inputs()
    args_tvm = [tvm.runtime.tensor(a) for a in inputs]
    request = ov.Core().compile_model(str(qdq), "CPU", {"INFERENCE_NUM_THREADS": 2,
                                                        "PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
    run = {"tvm": lambda: vm["main"](*args_tvm), "openvino": lambda: request.infer([inputs[0]])}
    if args.with_onnxruntime:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        session = ort.InferenceSession(str(qdq), opts, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: inputs[0]}
        run = {"tvm": run["tvm"], "onnxruntime": lambda: session.run(None, feed), "openvino": run["openvino"]}
    names = list(run)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        for key in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(args.settle)
            run[key]()
            t0 = time.perf_counter()
            run[key]()
            times[key].append((time.perf_counter() - t0) * 1e3)
    medians = {k: float(np.median(v)) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:12s} median {medians[k]:7.2f} ms, range {min(v):.1f}-{max(v):.1f}")
    print(f"TVM / OpenVINO: {medians['tvm'] / medians['openvino']:.3f}")
    write_result(args.out, "runtime_interference", {"db": args.db, "rounds": args.rounds, "settle_s": args.settle,
                                                    "with_onnxruntime": args.with_onnxruntime, "medians_ms": medians,
                                                    "samples_ms": times})  # fmt: skip


if __name__ == "__main__":
    main()
