"""Whole models against the peers: ``nightshift bench`` for a list of models on one database.

For each model: the build from ``--db`` (and the zero-trial fallback build when the database
tunes any of its operators) against ONNX Runtime, OpenVINO (f32 through ``INFERENCE_PRECISION_HINT``, and its
default precision),
PyTorch eager and ``torch.compile``, interleaved in rounds on one random input, on the
device's ``num-cores`` threads (see tuner/bench.py), each conv in the layout the database's
measurements favour (as ``nightshift bench``'s ``--layout auto``; recorded in the JSON). Writes
benchmarks/results/e2e_vs_peers.json, and e2e_vs_peers.png (ratios to the fastest f32 peer)
when matplotlib is installed. Ratios carry over between runs; milliseconds do not.

    nice -n 10 .venv/bin/python benchmarks/e2e_vs_peers.py --db tuned.db --models resnet50 mobilenet_v2 bert-base
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from rich.console import Console

from tuner.app.plan import measured_plan
from tuner.bench import DEFAULT_PEERS, BenchConfig, bench, render
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model

sys.path.insert(0, str(Path(__file__).parent))
from settle import settle

RESULTS = Path(__file__).parent / "results" / "e2e_vs_peers.json"
console = Console()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="tuning database (an empty file gives the fallback build only)")
    p.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2", "bert-base"])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--num-cores", type=int, default=None)
    p.add_argument("--peers", nargs="+", default=list(DEFAULT_PEERS))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--settle", type=float, default=600.0,
                   help="wait up to this many seconds for the 1-minute load to fall below 1 before timing "
                        "(right after a job its Ray cluster is still shutting down); 0: start at once")
    args = p.parse_args()
    if args.settle:
        settle(args.settle, console)
    device = parse_device("cpu", num_cores=args.num_cores)
    db = TuningDatabase(args.db)
    config = BenchConfig(rounds=args.rounds, peers=tuple(args.peers))
    results = []
    # The machines are shared: the load around the run says how far its milliseconds carry.
    load_before = os.getloadavg()
    for name in args.models:
        spec = load_model(name)
        model_config = config
        # Each conv's layout from the measurements, as `nightshift bench` chooses it.
        chosen = measured_plan(spec, device, db)
        if chosen is not None:
            console.print(f"{name}: layout plan {chosen.plan}: {chosen.describe()}", highlight=False, soft_wrap=True)
            model_config = dataclasses.replace(config, plan=chosen.plan, layout_choice=chosen)
        with console.status(f"{name}") as status:
            result = bench(spec, device, db, source=name, config=model_config,
                           on_stage=lambda text, n=name: status.update(f"{n}: {text}"))  # fmt: skip
        console.print(render(result))
        results.append(result.to_json())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": device.description.get("model"), "db": args.db,
        "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},
        "command": " ".join(sys.argv), "models": results,
    }  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    _plot(results, args.out.with_suffix(".png"))


def _plot(results: list[dict], path: Path) -> None:
    """Bar chart of every entry's ratio to the fastest f32 peer, one group per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("matplotlib is not installed: no chart (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(10, 4))
    keys = sorted({e["key"] for r in results for e in r["entries"] if e["ratio_to_fastest_peer"] is not None})
    width = 0.8 / max(len(keys), 1)
    for i, key in enumerate(keys):
        ratios = [next((e["ratio_to_fastest_peer"] or 0.0 for e in r["entries"] if e["key"] == key), 0.0)
                  for r in results]  # fmt: skip
        ax.bar([m + i * width for m in range(len(results))], ratios, width, label=key)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([m + 0.4 - width / 2 for m in range(len(results))], [r["model"] for r in results])
    ax.set_ylabel("latency / fastest f32 peer")
    ax.set_yscale("log")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
