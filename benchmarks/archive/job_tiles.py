"""What a job's conv tasks would cost with each kind of pixel tile of ``x86-conv2d-nchwc`` (or,
in a bf16 or int8 job, ``x86-conv2d-nchwc-dot``), from the job's own timings.

For every NCHW[x]c conv task of the job, the best timed record of each kind (row tiles,
fused tiles that divide the pixel count, fused tiles with a partial last tile, and any other
space), then the convs' time weighted by calls with every kind, without partial tiles, and
with row tiles (and other spaces) only. No new timing: it reads the tuning database and the
job's ``--log-json`` file (for the tasks' call counts). Writes
benchmarks/archive/results/job_tiles.json.

    .venv/bin/python benchmarks/archive/job_tiles.py --db job.db --log job.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sqlalchemy import create_engine, text

RESULTS = Path(__file__).parent / "results" / "job_tiles.json"
KINDS = ("rows", "fused", "partial", "other")
# Where reg_n, fuse_pixels, out_h and out_w sit in each template's point decisions (the order
# of the template's knobs; records store decisions only). out_h and out_w are the last two:
# x86-conv2d-nchwc-dot's points gained ``split`` before them in the fortieth session.
_TILE_KNOBS = {"x86-conv2d-nchwc": (0, 9, -2, -1), "x86-conv2d-nchwc-dot": (0, 7, -2, -1)}


def tile_kind(point: dict) -> str:
    """A record's kind of pixel tile (``other`` for another space)."""
    positions = _TILE_KNOBS.get(point.get("kind", ""))
    if positions is None:
        return "other"
    reg_n, fuse, out_h, out_w = (point["decisions"][i] for i in positions)
    if not fuse:
        return "rows"
    return "partial" if (out_h * out_w) % reg_n else "fused"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="the job's tuning database (a path or an SQLAlchemy URL)")
    p.add_argument("--log", type=Path, required=True, help="the job's --log-json file")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    start = next(json.loads(line) for line in args.log.open() if '"job_start"' in line)
    calls = {t["name"]: t["weight"] for t in start["tasks"] if "conv2d_NCHWc" in t["name"]}
    url = args.db if "://" in args.db else f"sqlite:///{args.db}"
    with create_engine(url).connect() as conn:
        rows = conn.execute(text(
            "SELECT w.name, r.point, r.mean_sec FROM records r JOIN workloads w ON w.id = r.workload_id "
            "WHERE r.error_class IS NULL AND r.mean_sec IS NOT NULL")).all()
    best: dict[str, dict[str, float]] = {}
    for name, point, sec in rows:
        if name in calls:
            kinds = best.setdefault(name, {})
            kind = tile_kind(json.loads(point))
            kinds[kind] = min(kinds.get(kind, float("inf")), float(sec))

    def total_ms(kinds: set[str]) -> float:
        return sum(calls[n] * min(v for k, v in b.items() if k in kinds) for n, b in best.items()) * 1e3

    winners = {k: sorted(n for n, b in best.items() if min(b, key=b.get) == k) for k in KINDS}
    report = {
        "benchmark": "job_tiles", "date": time.strftime("%Y-%m-%d"), "job": start.get("name"),
        "command": f"job_tiles.py --db {args.db} --log {args.log}", "conv_tasks": len(best),
        "convs_ms": {"all": total_ms(set(KINDS)), "without_partial": total_ms({"rows", "fused", "other"}),
                     "rows_only": total_ms({"rows", "other"})},
        "best_kind_counts": {k: len(v) for k, v in winners.items()},
        "tasks": {n: {"calls": calls[n], **{k: b[k] * 1e3 for k in b}} for n, b in sorted(best.items())},
    }
    print(json.dumps({k: report[k] for k in ("conv_tasks", "convs_ms", "best_kind_counts")}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
