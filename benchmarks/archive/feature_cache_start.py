"""What a job's start costs on a database that holds other jobs' records, with and without the
host's feature cache (:mod:`cost_models.feature_cache`).

One question: how long does :func:`cost_models.pretrain` (the cost model a ``tune`` job starts
with, on at most ``tuner.job.PRETRAIN_RECORDS`` records of this CPU family) take when every
record's features are rebuilt (trace replay and feature extraction), and when they come from
the cache that the first start filled? The records of the ``--db`` databases (this CPU's
family only) are first copied into one new database, as ``time_to_quality.py``'s ``evo-warm``
arm does. Each round times three starts in turn: the cache switched off, a cold (empty)
cache, and the cache the cold start left. The trained models are checked to predict alike.
Writes benchmarks/archive/results/feature_cache_start_<arch>.json (``--out``).

    .venv/bin/python benchmarks/archive/feature_cache_start.py --db /tmp/suite/*/tuning.db
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # benchmarks/
from result_file import machine, write_result  # noqa: E402
from time_to_quality import seed_warm  # noqa: E402

import cost_models  # noqa: E402
from cost_models.dataset import load_dataset  # noqa: E402
from tuner.db import TuningDatabase  # noqa: E402
from tuner.device import parse_device  # noqa: E402
from tuner.job import PRETRAIN_RECORDS  # noqa: E402


def _start(db: TuningDatabase, device, cache: str | None) -> tuple[float, cost_models.CostModel]:
    """Seconds of one job start's pre-training; ``cache``: the cache folder, None for off."""
    if cache is None:
        os.environ["NIGHTSHIFT_FEATURE_CACHE"] = "off"
    else:
        os.environ.pop("NIGHTSHIFT_FEATURE_CACHE", None)
        os.environ["NIGHTSHIFT_CACHE"] = cache
    start = time.perf_counter()
    model = cost_models.pretrain(db, device, seed=0, max_records=PRETRAIN_RECORDS)
    return time.perf_counter() - start, model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", nargs="+", type=Path, required=True, help="SQLite databases of this CPU family")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    device = parse_device("cpu")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "tuning.db"
        copied = seed_warm(merged, args.db)
        db = TuningDatabase(str(merged), create=False)
        # TVM's one-time import of its tensor intrinsics is not a start's cost: paid here first.
        load_dataset(db, device, max_records=8)
        rows = []
        for r in range(args.rounds):
            cold = Path(tmp) / f"cache{r}"
            off_s, off_model = _start(db, device, None)
            cold_s, _ = _start(db, device, str(cold))
            warm_s, warm_model = _start(db, device, str(cold))
            probe = load_dataset(db, device, max_records=256).features
            same = bool(np.allclose(off_model.predict(probe), warm_model.predict(probe), rtol=1e-5, atol=1e-6))
            size = sum(f.stat().st_size for f in cold.glob("features.sqlite*"))
            rows.append({"round": r, "off_s": off_s, "cold_cache_s": cold_s, "warm_cache_s": warm_s,
                         "records": off_model.num_samples, "cache_bytes": size, "same_predictions": same})  # fmt: skip
            print(f"round {r}: off {off_s:.1f} s, cold cache {cold_s:.1f} s, warm cache {warm_s:.1f} s "
                  f"({off_model.num_samples} records, {size / 1e6:.1f} MB cached; same: {same})")  # fmt: skip
        db.close()
    summary = {k: statistics.median(row[k] for row in rows) for k in ("off_s", "cold_cache_s", "warm_cache_s")}
    summary["off_over_warm"] = summary["off_s"] / summary["warm_cache_s"]
    print(f"median: off {summary['off_s']:.1f} s, warm cache {summary['warm_cache_s']:.1f} s "
          f"({summary['off_over_warm']:.1f}x)")  # fmt: skip
    out = args.out or Path(__file__).parent / "results" / f"feature_cache_start_{device.arch}.json"
    write_result(out, "feature_cache_start", {"machine": machine(device, load_before), "records_copied": copied,
                                              "databases": [str(d) for d in args.db], "rounds": rows,
                                              "summary": summary})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
