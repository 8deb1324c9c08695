"""Tuning-database benchmark: bulk insert rate and best-schedule lookup latency.

For each backend (SQLite file, PostgreSQL on the local server) and each size, a fresh database
gets N records through ``TuningDatabase.add_records`` (the path the tuner uses: 1,000-record
batches, idempotent insert), spread over 1,000 workloads and 2 devices, with a real
MetaSchedule record JSON as payload; then ``lookup`` (device, fallback policy) and ``best``
are timed on random workloads. Writes JSON to benchmarks/results/db_bench.json.

    nice -n 10 .venv/bin/python benchmarks/db_bench.py --sizes 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import sqlalchemy as sa
import tvm
from tvm import te

from tuner.compile import fallback_schedule
from tuner.db import NewRecord, TuningDatabase
from tuner.device import Device, parse_device
from tuner.graph.keys import workload_key

RESULTS = Path(__file__).parent / "results" / "db_bench.json"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
WORKLOADS = 1000
BATCH = 1000
LOOKUPS = 300


def _mod(n: int) -> tvm.IRModule:
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * 2, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def _payload(device: Device) -> str:
    """A real record JSON (a tiled matmul's trace) so rows have a realistic size."""
    a = te.placeholder((128, 128), name="A")
    b = te.placeholder((128, 128), name="B")
    k = te.reduce_axis((0, 128), name="k")
    c = te.compute((128, 128), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    sch = fallback_schedule(mod, device.target)
    rec = tvm.s_tir.meta_schedule.database.TuningRecord(
        sch.trace, tvm.s_tir.meta_schedule.database.Workload(mod), [1e-3], device.target, None)
    return json.dumps(rec.as_json())


def _twin(device: Device) -> Device:
    desc = dict(device.description) | {"model": "benchmark twin"}
    return Device(kind=device.kind, index=0, target_config=device.target_config, description=desc)


def run(url: str, n: int, device: Device, payload: str) -> dict:
    db = TuningDatabase(url)
    keys = []
    t0 = time.perf_counter()
    for w in range(WORKLOADS):
        mod = _mod(w + 1)
        key = workload_key(mod)
        db.workload_id(key, f"w{w}", mod, float(w + 1))
        keys.append(key)
    setup_s = time.perf_counter() - t0
    devs = [db.device_id(device), db.device_id(_twin(device))]
    rng = random.Random(0)
    job = db.start_job("bench", devs[0], {}, n)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        m = min(BATCH, n - done)
        recs = []
        for i in range(done, done + m):
            err = rng.random() < 0.1
            secs = [] if err else [rng.uniform(1e-4, 1e-2) for _ in range(3)]
            point = json.dumps({"i": i, "tiles": [rng.randrange(64) for _ in range(8)]})
            recs.append(NewRecord(
                workload_key=keys[i % WORKLOADS], point=point,
                record_json=payload, run_secs=secs, error_class="build_error" if err else None,
                build_sec=rng.uniform(0.1, 1.0),
            ))  # fmt: skip
        db.add_records(devs[(done // BATCH) % 2], job, recs)
        done += m
    insert_s = time.perf_counter() - t0
    assert db.count_records() == n

    def timed(fn) -> list[float]:
        out = []
        for _ in range(LOOKUPS):
            key = rng.choice(keys)
            t = time.perf_counter()
            fn(key)
            out.append(time.perf_counter() - t)
        return out

    lookup = timed(lambda key: db.lookup(key, devs[0], 1))
    best = timed(lambda key: db.best(key, devs[0], 1))
    top10 = timed(lambda key: db.lookup(key, devs[0], 10))
    db.close()

    def ms(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"median_ms": statistics.median(xs) * 1e3, "p95_ms": xs[int(0.95 * len(xs)) - 1] * 1e3}

    return {
        "records": n, "workloads": WORKLOADS, "devices": 2, "batch": BATCH, "payload_bytes": len(payload),
        "workload_setup_s": setup_s, "insert_s": insert_s, "insert_records_per_s": n / insert_s,
        "lookup_best_1": ms(lookup), "best_1": ms(best), "lookup_top_10": ms(top10),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    p.add_argument("--workdir", type=Path, default=Path("/tmp"))
    args = p.parse_args()
    device = parse_device("cpu")
    payload = _payload(device)
    results = []
    for n in args.sizes:
        for backend in args.backends:
            if backend == "sqlite":
                path = args.workdir / f"nightshift-bench-{uuid.uuid4().hex[:8]}.db"
                try:
                    res = run(str(path), n, device, payload)
                    res["file_mb"] = path.stat().st_size / 2**20
                finally:
                    for suffix in ("", "-wal", "-shm"):
                        Path(str(path) + suffix).unlink(missing_ok=True)
            else:
                admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
                name = f"ns_bench_{uuid.uuid4().hex[:8]}"
                with admin.connect() as conn:
                    conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
                try:
                    res = run(admin.url.set(database=name).render_as_string(hide_password=False), n, device, payload)
                finally:
                    with admin.connect() as conn:
                        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                    admin.dispose()
            res["backend"] = backend
            results.append(res)
            sys.stdout.write(json.dumps(res) + "\n")
            sys.stdout.flush()
            _write(results)


def _write(results: list[dict]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "db_bench",
        "command": "nice -n 10 .venv/bin/python benchmarks/db_bench.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "tvm": tvm.__version__, "sqlalchemy": sa.__version__,
        "results": results,
    }, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
