"""What an AMX kernel pays to configure its tiles, per call: ``ldtilecfg`` every time against
reading the configuration back (``sttilecfg``) and loading it only when it differs, as the
``init`` intrinsic of ``search_spaces.templates.intrin_amx`` does. Cycles are TSC ticks per
call (the median of ``--runs`` runs of ``amx_tile_config.c``, each 200,000 calls), beside one
tile load pair and ``tdpbf16ps`` for scale. Needs gcc and an AMX CPU (``amx_bf16``).

    .venv/bin/python benchmarks/archive/amx_tile_config.py --out benchmarks/archive/results/amx_tile_config.json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/archive/results/amx_tile_config.json")
    args = parser.parse_args()
    runs = [json.loads(out) for out in run_c(SOURCE, ["-mamx-tile", "-mamx-bf16"], args.runs)]
    keys = [k for k in runs[0] if k not in ("reloads", "calls")]
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    for k, v in median.items():
        print(f"{k:30s} {v:8.1f} cycles per call")
    write_result(Path(args.out), "amx_tile_config",
                 {"cpu": cpu_model(), "tsc_cycles_per_call_median": median, "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()
