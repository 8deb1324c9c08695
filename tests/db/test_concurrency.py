"""Several processes writing to one database at once: nothing lost, nothing doubled, no deadlock."""

import traceback

import sqlalchemy as sa

PROCS = 4
BATCHES = 6
PER_BATCH = 25
SHARED = 20
JOIN_TIMEOUT_S = 240


def _writer(url: str, index: int, barrier, errors) -> None:
    """One tuning process: opens the (maybe still empty) database and writes its records."""
    try:
        from dbtest_utils import EMPTY_RECORD, add_mod

        from tuner.db import NewRecord, TuningDatabase
        from tuner.device import parse_device
        from tuner.graph.keys import workload_key

        barrier.wait(timeout=120)
        # Every process races to create the schema, the device and the workloads.
        db = TuningDatabase(url)
        device = db.device_id(parse_device("cpu"))
        mods = [add_mod(8 + i) for i in range(3)]
        keys = [workload_key(m) for m in mods]
        for key, mod in zip(keys, mods, strict=True):
            db.workload_id(key, "add", mod, 8.0)
        job = db.start_job(f"proc{index}", device, {"index": index}, BATCHES * PER_BATCH)
        for b in range(BATCHES):
            batch = [
                NewRecord(workload_key=keys[(b + i) % 3], point=f'{{"proc": {index}, "i": {b * PER_BATCH + i}}}',
                          record_json=EMPTY_RECORD, run_secs=[1e-3 + 1e-6 * i])
                for i in range(PER_BATCH)
            ]  # fmt: skip
            db.add_records(device, job, batch)
            # The same batch again, as a retry after a lost acknowledgement would send it.
            db.add_records(device, job, batch[: PER_BATCH // 2])
            db.update_job(job, trials_done=(b + 1) * PER_BATCH)
        # Records every process writes without a job (e.g. an import run on every machine).
        shared = [NewRecord(workload_key=keys[0], point=f'{{"shared": {i}}}', record_json=EMPTY_RECORD, run_secs=[2e-3])
                  for i in range(SHARED)]  # fmt: skip
        db.add_records(device, None, shared[::-1] if index % 2 else shared)
        db.update_job(job, state="done")
        db.close()
    except BaseException:
        errors.put(f"process {index}: {traceback.format_exc()}")
        raise


def test_concurrent_writers(db_url):
    from dbtest_utils import run_at_once

    run_at_once(_writer, lambda i: (db_url, i), PROCS, JOIN_TIMEOUT_S)

    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        total = conn.execute(sa.text("SELECT count(*) FROM records")).scalar()
        distinct = conn.execute(sa.text(
            "SELECT count(*) FROM (SELECT DISTINCT workload_id, device_id, point FROM records) AS d")).scalar()
        per_job = dict(conn.execute(sa.text(
            "SELECT j.model, count(r.id) FROM jobs j JOIN records r ON r.job_id = j.id GROUP BY j.model")).all())
        jobs = conn.execute(sa.text("SELECT state, trials_done FROM jobs")).all()
        devices = conn.execute(sa.text("SELECT count(*) FROM devices")).scalar()
        workloads = conn.execute(sa.text("SELECT count(*) FROM workloads")).scalar()
    engine.dispose()
    assert total == distinct == PROCS * BATCHES * PER_BATCH + SHARED
    assert per_job == {f"proc{i}": BATCHES * PER_BATCH for i in range(PROCS)}
    assert sorted(jobs) == [("done", BATCHES * PER_BATCH)] * PROCS
    assert (devices, workloads) == (1, 3)
