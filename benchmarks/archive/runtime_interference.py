"""Does one runtime slow the next in interleaved rounds? TVM's int8 ResNet-50 and OpenVINO on
the same QDQ file (``--precision bf16``: TVM's bf16 build and OpenVINO at its default precision,
bf16 where the CPU has AVX512_BF16 or AMX, on the float model), with and without ONNX Runtime
in the rotation, with and without a pause.

The rounds are ``tuner.bench.interleave``'s (each runtime once per round, a warm-up run then a
timed one, the start rotating), with ``--settle`` seconds of sleep before each warm-up; the
runtimes are the benchmark's own peers (``openvino-f32``: OpenVINO with
``INFERENCE_PRECISION_HINT=f32``, so its float parts do not run in its bf16 default on CPUs with
AVX512_BF16 or AMX, and its int8 kernels where the file is quantized, as
``precision_vs_peers.py`` runs it; ``onnxruntime``). Each runtime's label and the precision it
reports are recorded.
With ``--antagonist`` this process runs on the first CPU (one thread a runtime) and a second
process streams copies of 256 MB arrays on the second CPU, resumed for one half of each
round's timings and stopped for the other: a repeatable stand-in for the host's slow phases,
in which TVM slowed more than OpenVINO (benchmarks/archive/README.md, "the host's slow phases").
With ``--dot-rate KERNEL`` ``benchmarks/archive/dot_rate.c`` runs before every round (one core, e.g.
``vdpbf16ps``): whether the rounds in which a runtime slows are rounds in which the core
retires fewer instructions (lower clocks) or not.
``tuner.bench`` pauses 0.1 s since this script showed ONNX Runtime's threads slowing
OpenVINO after it (benchmarks/archive/README.md, "The interleaved rounds favoured TVM"). With
``--back-to-back N`` each runtime first runs alone, N timed runs in a row after three warm-ups,
so its steady speed sits beside its speed in the rounds. Writes
benchmarks/archive/results/runtime_interference.json (``--out``).

    .venv/bin/python benchmarks/archive/runtime_interference.py --db /work/bench/r50_int8.db --with-onnxruntime --settle 0
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
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

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
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


# Two 256 MB arrays copied back and forth: far beyond any L3, so every copy goes to DRAM.
_STREAM = ("import numpy as np\na = np.ones(1 << 26, np.float32); b = np.empty_like(a)\n"
           "while True: np.copyto(b, a); np.copyto(a, b)")


def antagonist_rounds(runners: dict, inputs: list[np.ndarray], rounds: int, settle_s: float, cpu: int) -> dict:
    """Each runner's milliseconds with the memory stream on ``cpu`` stopped (``quiet``) and
    running (``streaming``): ``rounds`` of ``interleave``'s rounds in each state, the states
    going quiet, streaming, streaming, quiet, ... so that each runner starts as often in each."""
    stream = subprocess.Popen([sys.executable, "-c", _STREAM], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    states = [("quiet", "streaming")[(r + r // 2) % 2] for r in range(2 * rounds)]

    def switch(r: int) -> None:
        stream.send_signal(signal.SIGSTOP if states[r] == "quiet" else signal.SIGCONT)
        time.sleep(0.3)

    try:
        time.sleep(2.0)  # the stream allocates and touches its arrays
        samples, _ = interleave(runners, inputs, rounds=2 * rounds, settle_s=settle_s, before_round=switch)
    finally:
        stream.kill()
    return {state: {k: [t * 1e3 for t, s in zip(v, states, strict=True) if s == state] for k, v in samples.items()}
            for state in ("quiet", "streaming")}  # fmt: skip


def dot_rate_binary() -> Path:
    """``benchmarks/archive/dot_rate.c`` built with gcc in a temporary folder."""
    binary = Path(tempfile.mkdtemp()) / "dot_rate"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(Path(__file__).parent / "dot_rate.c")], check=True)
    return binary


def dot_rate(binary: Path, kernel: str) -> float:
    """The median of dot_rate's three runs of ``kernel``: instructions a second on one core."""
    out = subprocess.run([str(binary), kernel], check=True, capture_output=True, text=True).stdout
    return float(np.median([r["instructions_per_s"] for r in json.loads(out)["runs"]]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="a ResNet-50 tuning database of --precision")
    p.add_argument("--precision", choices=("int8", "bf16"), default="int8")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--settle", type=float, default=0.0, help="seconds of sleep before each warm-up")
    p.add_argument("--with-onnxruntime", action="store_true", help="ONNX Runtime in the rotation too")
    p.add_argument("--back-to-back", type=int, default=0,
                   help="first time each runtime alone, this many runs in a row after three warm-ups")
    p.add_argument("--antagonist", action="store_true",
                   help="one CPU for the runtimes, a memory stream on another, on and off by turns")
    p.add_argument("--dot-rate", choices=("vdpbf16ps", "fma", "vpdpbusd", "avx2"),
                   help="run benchmarks/archive/dot_rate.c with this kernel before every round (needs gcc)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    threads = int(device.target_config.get("num-cores") or 1)
    cpus = sorted(os.sched_getaffinity(0))
    if args.antagonist:  # before TVM's pool starts: it takes as many threads as CPUs it may use
        if len(cpus) < 2:
            sys.exit("--antagonist needs two CPUs: one for the runtimes, one for the memory stream")
        os.sched_setaffinity(0, {cpus[0]})
        threads = 1
    if args.precision == "int8":
        source = str(quantized_model(load_model("resnet50"), "resnet50", DEFAULT_CALIBRATION))
        openvino = "openvino-f32"  # the QDQ file's int8 kernels, its float parts in f32
    else:
        source, openvino = "resnet50", "openvino"  # OpenVINO's default: bf16 on such CPUs
    spec = load_model(source)
    compiled = compile_model(spec, device, TuningDatabase(args.db), precision=args.precision)
    model = peer_model(spec, source, Path(tempfile.mkdtemp()))
    runners: dict = {"tvm": TvmRunner(compiled, device, "TVM, database", args.precision)}
    for name in (["onnxruntime"] if args.with_onnxruntime else []) + [openvino]:
        peer = create(name)
        peer.prepare(model, threads)  # as tuner.bench does
        runners[name] = peer
    inputs = spec.random_inputs()
    if args.antagonist:
        times = antagonist_rounds(runners, inputs, args.rounds, args.settle, cpus[1])
        report_antagonist(args, runners, openvino, times)
        return
    alone = {k: back_to_back(r, inputs, args.back_to_back) for k, r in runners.items()} if args.back_to_back else {}
    rates: list[float] = []
    read_rate = None
    if args.dot_rate:
        binary = dot_rate_binary()
        read_rate = lambda r: rates.append(dot_rate(binary, args.dot_rate))  # noqa: E731
    samples, order = interleave(runners, inputs, rounds=args.rounds, settle_s=args.settle, before_round=read_rate)
    times = {k: [t * 1e3 for t in v] for k, v in samples.items()}
    medians = {k: float(np.median(v)) for k, v in times.items()}
    for k, v in times.items():
        print(f"{runners[k].label:32s} median {medians[k]:7.2f} ms, range {min(v):.1f}-{max(v):.1f}")
    print(f"TVM / OpenVINO: {medians['tvm'] / medians[openvino]:.3f}")
    correlation = {}
    if rates:
        correlation = {k: float(np.corrcoef(v, rates)[0, 1]) for k, v in times.items()}
        print(f"{args.dot_rate} on one core: {min(rates):.3g}-{max(rates):.3g} a second "
              f"(median {np.median(rates):.3g}); correlation of each round's time with it: "
              + ", ".join(f"{runners[k].label} {c:+.2f}" for k, c in correlation.items()))
    if alone:
        print("back to back: " + ", ".join(f"{runners[k].label} {v:.2f} ms" for k, v in alone.items())
              + f"; TVM / OpenVINO {alone['tvm'] / alone[openvino]:.3f}")
    write_result(args.out, "runtime_interference", {
        "db": args.db, "precision": args.precision, "rounds": args.rounds, "settle_s": args.settle,
        "with_onnxruntime": args.with_onnxruntime,
        "labels": {k: r.label for k, r in runners.items()},
        "precisions": {k: r.precision for k, r in runners.items()}, "medians_ms": medians, "samples_ms": times,
        "order": order, "back_to_back_runs": args.back_to_back, "back_to_back_medians_ms": alone,
        "dot_rate_kernel": args.dot_rate, "dot_rate_per_round": rates, "correlation_with_dot_rate": correlation,
    })  # fmt: skip



def report_antagonist(args: argparse.Namespace, runners: dict, openvino: str, times: dict) -> None:
    """Print and write each runtime's medians without and with the memory stream."""
    medians = {state: {k: float(np.median(v)) for k, v in by_key.items()} for state, by_key in times.items()}
    for k, r in runners.items():
        q, s = medians["quiet"][k], medians["streaming"][k]
        print(f"{r.label:32s} quiet {q:7.2f} ms, streaming {s:7.2f} ms: {s / q:.3f}x")
    for state, m in medians.items():
        print(f"TVM / OpenVINO, {state}: {m['tvm'] / m[openvino]:.3f}")
    write_result(args.out, "runtime_interference_antagonist", {
        "db": args.db, "precision": args.precision, "rounds": args.rounds, "settle_s": args.settle,
        "threads": 1, "labels": {k: r.label for k, r in runners.items()},
        "precisions": {k: r.precision for k, r in runners.items()}, "medians_ms": medians, "samples_ms": times,
    })  # fmt: skip


if __name__ == "__main__":
    main()
