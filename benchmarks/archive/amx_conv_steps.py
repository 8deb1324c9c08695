"""What one reduction step of an AMX conv tile costs (``amx_conv_steps.c``): ``tn`` B tile
loads, ``tm`` A tile loads and ``tm x tn`` tile multiplies, for A rows of one 16-channel
block (as ``x86-conv2d-amx`` reads ``NCHW16c``: 32 bytes of bfloat16, 16 of uint8) against
a whole 64-byte row (a wide block, :func:`tuner.layout.wide_blocks`). TSC cycles per step
and multiply-adds per cycle, the median of ``--runs`` runs of 20,000 steps each, operands
in L1/L2. Needs gcc and an AMX CPU (``amx_bf16``, ``amx_int8``).

    .venv/bin/python benchmarks/archive/amx_conv_steps.py --out benchmarks/archive/results/amx_conv_steps.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from c_loop import cpu_model, run_c
import sys  # the maintained helpers stay in benchmarks/, one folder up
sys.path.append(str(Path(__file__).resolve().parents[1]))
from result_file import write_result

SOURCE = Path(__file__).with_suffix(".c")
_KEY = ("inst", "tm", "tn", "rows", "channels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/archive/results/amx_conv_steps.json")
    args = parser.parse_args()
    outputs = run_c(SOURCE, ["-mamx-tile", "-mamx-bf16", "-mamx-int8"], args.runs)
    runs = [[json.loads(line) for line in out.splitlines()] for out in outputs]
    rows = []
    for i, first in enumerate(runs[0]):
        cycles = statistics.median(r[i]["cycles_per_step"] for r in runs)
        macs = statistics.median(r[i]["macs_per_cycle"] for r in runs)
        rows.append({k: first[k] for k in _KEY} | {"cycles_per_step": cycles, "macs_per_cycle": macs})
    print(f"{'instruction':10s} {'tm':>3s} {'tn':>3s} {'rows':>5s} {'channels':>9s} {'cycles/step':>12s} "
          f"{'MAC/cycle':>10s}")
    for r in rows:
        print(f"{r['inst']:10s} {r['tm']:3d} {r['tn']:3d} {r['rows']:5d} {r['channels']:9d} "
              f"{r['cycles_per_step']:12.1f} {r['macs_per_cycle']:10.1f}")
    write_result(Path(args.out), "amx_conv_steps", {"cpu": cpu_model(), "steps": rows})


if __name__ == "__main__":
    main()
