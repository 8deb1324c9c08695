"""TVM's tuned build and one peer, run alternately many times in one process: a time series.

``e2e_vs_peers.py`` gives medians over interleaved rounds. On this shared 2-core machine a
model's latency is bimodal over time: stretches of seconds to minutes in which every
runtime is slower (a state of the host, not of one process; it comes and goes inside a
process). This script times the two side by side, iteration after iteration (TVM, then the
peer, on the same input and threads), marks each iteration fast (``F``, within 6% of that
runtime's minimum), slow (``s``, within 25%) or an outlier (``X``), and gives the ratio of
the two over the iterations where both were fast and over all of them. So a ratio taken in
a slow stretch can be told apart from one taken in a quiet one. The default peer,
``openvino-f32``, runs OpenVINO with ``INFERENCE_PRECISION_HINT`` f32; a plain ``openvino``
runs its default precision (bf16 on CPUs with AVX512_BF16) and its label says so. Writes
benchmarks/results/paired_series.json (``--out``).

    .venv/bin/python benchmarks/paired_series.py --db tuned.db --model resnet50 --peer openvino-f32 --iterations 150
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from tuner.bench import TvmRunner, peer_model
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.peers import create

console = Console()
RESULTS = Path(__file__).parent / "results" / "paired_series.json"
sys.path.insert(0, str(Path(__file__).parent))
from result_file import write_result  # noqa: E402
from settle import settle  # noqa: E402


def states(ms: list[float]) -> str:
    """``F``/``s``/``X`` per iteration, against the series' own minimum."""
    low = min(ms)
    return "".join("F" if t < low * 1.06 else "s" if t < low * 1.25 else "X" for t in ms)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--peer", default="openvino-f32")
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--settle", type=float, default=600.0,
                   help="wait up to this many seconds for the 1-minute load to fall below 1; 0: start at once")
    args = p.parse_args()
    if args.settle:
        settle(args.settle, console)
    device = parse_device("cpu")
    spec = load_model(args.model)
    tvm_runner = TvmRunner(compile_model(spec, device, TuningDatabase(args.db)), device, "TVM, database")
    peer = create(args.peer)
    with tempfile.TemporaryDirectory(prefix="nightshift-peers-") as workdir:
        peer.prepare(peer_model(spec, args.model, Path(workdir)), int(device.target_config.get("num-cores") or 1))
        inputs = spec.random_inputs(seed=0)
        for runner in (tvm_runner, peer):
            runner.run(inputs)  # first-touch allocations, thread pools, lazy compilation
        series: dict[str, list[float]] = {"tvm": [], args.peer: []}
        load_before = os.getloadavg()
        for _ in range(args.iterations):
            for key, runner in (("tvm", tvm_runner), (args.peer, peer)):
                t0 = time.perf_counter()
                runner.run(inputs)
                series[key].append((time.perf_counter() - t0) * 1e3)
    marks = {key: states(ms) for key, ms in series.items()}
    both_fast = [i for i in range(args.iterations) if all(m[i] == "F" for m in marks.values())]
    tvm_ms, peer_ms = series["tvm"], series[args.peer]
    summary = {
        "tvm_median_ms": statistics.median(tvm_ms), "peer_median_ms": statistics.median(peer_ms),
        "ratio_all": statistics.median(tvm_ms) / statistics.median(peer_ms),
        "iterations_both_fast": len(both_fast),
        "ratio_both_fast": (statistics.median(tvm_ms[i] for i in both_fast)
                            / statistics.median(peer_ms[i] for i in both_fast)) if both_fast else None,
        "slowdown_in_slow_iterations": {
            key: statistics.median(t for t, m in zip(ms, marks[key], strict=True) if m != "F") / min(ms)
            if "F" in marks[key] and any(m != "F" for m in marks[key]) else None
            for key, ms in series.items()
        },
    }  # fmt: skip
    for key, ms in series.items():
        console.print(f"{key:>14}: min {min(ms):6.1f} median {statistics.median(ms):6.1f} ms  {marks[key]}")
    both = summary["ratio_both_fast"]
    console.print(f"TVM / {args.peer}: {summary['ratio_all']:.2f}x over all {args.iterations} iterations; "
                  + (f"{both:.2f}x over the {len(both_fast)} where both were fast" if both else "never both fast"))
    write_result(args.out, "paired_series", {
        "model": args.model, "db": args.db, "peer": args.peer, "peer_label": peer.label,
        "cpu": device.description.get("model"), "target": str(device.target),
        "load_before": load_before, "load_after": os.getloadavg(),
        "summary": summary, "series_ms": series, "states": marks,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
