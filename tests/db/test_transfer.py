"""Copying records between tuning databases (tuner.db.transfer): rows matched by key, not id."""

from __future__ import annotations

import sqlalchemy as sa
from dbtest_utils import EMPTY_RECORD, add_mod, fake_cpu, matmul_mod

from tuner.db import NewRecord, TuningDatabase
from tuner.db.schema import DeviceRow, RecordRow, WorkloadRow
from tuner.db.transfer import CopySummary, copy_records
from tuner.graph.keys import workload_key


def _rec(key: str, point: str, secs: list[float], error: str | None = None) -> NewRecord:
    return NewRecord(workload_key=key, point=point, record_json=EMPTY_RECORD, run_secs=secs, error_class=error)


def _count(db: TuningDatabase, model) -> int:
    with db.session(write=False) as s:
        return int(s.scalar(sa.select(sa.func.count()).select_from(model)))


def test_copy_matches_rows_by_key_keeps_no_job_and_a_second_copy_adds_nothing(db_url, cpu_device, tmp_path):
    add, matmul = add_mod(), matmul_mod(16)
    add_key, matmul_key = workload_key(add), workload_key(matmul)
    twin = fake_cpu(cpu_device, cores=64, model="same arch, other machine")
    alien = fake_cpu(cpu_device, mcpu="cortex-a72", model="another architecture")

    # The destination first, so that its ids and the source's differ.
    dst = TuningDatabase(db_url)
    dst.workload_id(add_key, "add", add, 8.0)
    dst_dev = dst.device_id(cpu_device)
    dst_job = dst.start_job("mine", dst_dev, {}, 1)
    dst.add_records(dst_dev, dst_job, [_rec(add_key, "a", [9e-3])])

    src = TuningDatabase(str(tmp_path / "src.db"))
    src.device_id(alien)
    src_twin, src_dev = src.device_id(twin), src.device_id(cpu_device)
    src.workload_id(matmul_key, "matmul", matmul, 2 * 16**3)
    src.workload_id(add_key, "add", add, 8.0)
    job = src.start_job("other model", src_dev, {}, 4)
    src.add_records(src_dev, job, [_rec(add_key, "a", [1e-3]), _rec(add_key, "b", [2e-3]),
                                   _rec(add_key, "c", [], "build_error"), _rec(matmul_key, "m", [4e-3])])  # fmt: skip
    src.add_records(src_twin, job, [_rec(matmul_key, "t", [5e-3])])
    src.add_records(src.device_id(alien), job, [_rec(add_key, "x", [1e-3])])

    # The twin is new in dst, matmul too; "a" was measured in dst already and stays dst's own.
    assert copy_records(src, dst, device=cpu_device) == CopySummary(devices=1, workloads=1, records=4)
    assert _count(dst, WorkloadRow) == 2 and _count(dst, DeviceRow) == 2
    with dst.session(write=False) as s:
        rows = {r.point: r for r in s.scalars(sa.select(RecordRow))}
    assert sorted(rows) == ["a", "b", "c", "m", "t"]
    assert rows["a"].job_id == dst_job and rows["a"].mean_sec == 9e-3
    assert all(rows[p].job_id is None for p in "bcmt")
    assert rows["c"].error_class == "build_error" and rows["b"].host and rows["b"].origin == "local"
    assert dst.job_trials(dst_job) == 1
    # Ids remapped: lookups in dst find the copied records under dst's workload and device ids.
    assert [r.point for r in dst.best(matmul_key, dst_dev)] == ["m"]
    assert [r.point for r in dst.best(add_key, dst_dev, k=3)] == ["b", "a"]
    assert dst.find_device_id(twin) is not None and dst.find_device_id(alien) is None

    assert copy_records(src, dst, device=cpu_device) == CopySummary(devices=0, workloads=0, records=0)
    assert _count(dst, RecordRow) == 5
    # Without a device, every family's records: the other architecture's one is added.
    assert copy_records(src, dst) == CopySummary(devices=1, workloads=0, records=1)
    assert _count(dst, RecordRow) == 6 and _count(dst, WorkloadRow) == 2
    src.close()
    dst.close()
