"""What an AMX kernel pays to configure its tiles, per call: ``ldtilecfg`` every time against
reading the configuration back (``sttilecfg``) and loading it only when it differs, as the
``init`` intrinsic of ``search_spaces.templates.intrin_amx`` does. Cycles are TSC ticks per
call (the median of ``--runs`` runs of ``amx_tile_config.c``, each 200,000 calls), beside one
tile load pair and ``tdpbf16ps`` for scale. Needs gcc and an AMX CPU (``amx_bf16``).

    .venv/bin/python benchmarks/amx_tile_config.py --out benchmarks/results/amx_tile_config.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from result_file import write_result

SOURCE = Path(__file__).with_suffix(".c")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/amx_tile_config.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "amx_tile_config"
        subprocess.run(["gcc", "-O2", "-mamx-tile", "-mamx-bf16", str(SOURCE), "-o", str(exe)], check=True)
        runs = [json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
                for _ in range(args.runs)]
    keys = [k for k in runs[0] if k not in ("reloads", "calls")]
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    for k, v in median.items():
        print(f"{k:30s} {v:8.1f} cycles per call")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "")
    write_result(Path(args.out), "amx_tile_config", {"cpu": cpu, "tsc_cycles_per_call_median": median, "runs": runs})


if __name__ == "__main__":
    main()
