"""MetaSchedule JSON database <-> Nightshift database, both directions, round trip."""

import json
from pathlib import Path

import numpy as np
import pytest
from dbtest_utils import add_mod, matmul_mod
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord, Workload

import search_spaces
from tuner import cli
from tuner.db import NewRecord, TuningDatabase
from tuner.db.interop import RECORD_FILE, WORKLOAD_FILE, export_json, import_json, trace_point
from tuner.errors import UserInputError
from tuner.graph.keys import workload_key


def _fill(db: TuningDatabase, device, *, per_workload: int = 4) -> dict[str, list[float]]:
    """Real schedules of two workloads (sampled from their design spaces), with timings."""
    target = device.target
    dev = db.device_id(device)
    rng = np.random.default_rng(7)
    times: dict[str, list[float]] = {}
    for mod in (matmul_mod(32), add_mod(64)):
        key = workload_key(mod)
        db.workload_id(key, "w", mod, 1.0)
        space = search_spaces.create(mod, target, seed=3)
        records = []
        for i in range(per_workload):
            sch = space.apply(space.sample(rng))
            secs = [1e-4 * (i + 1), 1.1e-4 * (i + 1)]
            rec = TuningRecord(sch.trace, Workload(mod), secs, target, ArgInfo.from_prim_func(mod["main"]))
            record_json = json.dumps(rec.as_json())
            records.append(NewRecord(workload_key=key, point=f"p{i}", record_json=record_json, run_secs=secs))
        records.append(NewRecord(workload_key=key, point="failed", record_json="[]", run_secs=[], error_class="build"))
        db.add_records(dev, None, records)
        times[key] = [float(np.mean([1e-4 * (i + 1), 1.1e-4 * (i + 1)])) for i in range(per_workload)]
    return times


def _lines(folder: Path) -> tuple[set, set]:
    workloads = [json.loads(x) for x in (folder / WORKLOAD_FILE).read_text().splitlines() if x]
    records = set()
    for line in (folder / RECORD_FILE).read_text().splitlines():
        index, rec = json.loads(line)
        # Identify the workload by its structural hash, not its position in the file.
        records.add((workloads[index][0], json.dumps(rec, sort_keys=True)))
    return {w[0] for w in workloads}, records


def test_round_trip(db_url, tmp_path, cpu_device):
    db = TuningDatabase(db_url)
    times = _fill(db, cpu_device)
    first = tmp_path / "first"
    res = export_json(db, db.device_id(cpu_device), first)
    assert (res.workloads, res.records, res.skipped) == (2, 8, 0)

    # TVM reads the export and finds the same best schedule as the database.
    tvm_db = JSONDatabase(path_workload=str(first / WORKLOAD_FILE), path_tuning_record=str(first / RECORD_FILE))
    assert len(tvm_db) == 8
    for mod in (matmul_mod(32), add_mod(64)):
        best = tvm_db.get_top_k(tvm_db.commit_workload(mod), 1)[0]
        assert float(np.mean([float(x) for x in best.run_secs])) == pytest.approx(times[workload_key(mod)][0])
        assert json.loads(db.best(workload_key(mod), db.device_id(cpu_device))[0].record_json)[0] == \
            best.as_json()[0]  # fmt: skip

    # Into a fresh database and out again: the same workloads and records.
    other = TuningDatabase(str(tmp_path / "other.db"))
    res = import_json(other, other.device_id(cpu_device), "cpu", first)
    assert (res.workloads, res.records, res.skipped) == (2, 8, 0)
    again = import_json(other, other.device_id(cpu_device), "cpu", first)
    assert (again.records, again.skipped) == (0, 8), "importing twice must not duplicate"
    assert other.count_records() == 8
    # Imported records stay foreign: not passed on by an export as if measured there.
    assert export_json(other, other.device_id(cpu_device), tmp_path / "second").records == 0
    for key, secs in times.items():
        rows = other.best(key, other.device_id(cpu_device), k=10, origin="import")
        assert [r.mean_sec for r in rows] == pytest.approx(secs)
        assert all(r.point == trace_point(r.record_json) for r in rows)
        assert other.best(key, other.device_id(cpu_device), k=10) == []

    # --top-k exports only the best of each workload.
    top = tmp_path / "top"
    assert export_json(db, db.device_id(cpu_device), top, top_k=1).records == 2


def test_import_of_records_tvm_wrote(tmp_path, cpu_device):
    """A database written by TVM's own JSONDatabase (as tune_tir does) imports as-is."""
    target = cpu_device.target
    folder = tmp_path / "ms"
    folder.mkdir()
    ms_db = JSONDatabase(path_workload=str(folder / WORKLOAD_FILE), path_tuning_record=str(folder / RECORD_FILE),
                         allow_missing=True)  # fmt: skip
    mod = matmul_mod(32)
    space = search_spaces.create(mod, target, seed=1)
    workload = ms_db.commit_workload(mod)
    rng = np.random.default_rng(0)
    for i, secs in enumerate(([3e-4], [1e-4], [1e10])):  # MetaSchedule writes failures as 1e10 s
        sch = space.apply(space.sample(rng))
        ms_db.commit_tuning_record(TuningRecord(sch.trace, workload, secs, target, None))
        assert i >= 0
    db = TuningDatabase(str(tmp_path / "t.db"))
    res = import_json(db, db.device_id(cpu_device), "cpu", folder)
    assert (res.workloads, res.records) == (1, 3)
    best = db.best(workload_key(mod), db.device_id(cpu_device), k=5, origin="import")
    assert [r.mean_sec for r in best] == pytest.approx([1e-4, 3e-4])
    assert db.stats()["failed_records"] == 1


def test_bad_input(tmp_path, cpu_device):
    db = TuningDatabase(str(tmp_path / "t.db"))
    dev = db.device_id(cpu_device)
    with pytest.raises(UserInputError, match="not found"):
        import_json(db, dev, "cpu", tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / WORKLOAD_FILE).write_text("this is not json\n")
    (broken / RECORD_FILE).write_text("[0, [\n")
    with pytest.raises(UserInputError, match="cannot read the MetaSchedule database"):
        import_json(db, dev, "cpu", broken)
    _fill(db, cpu_device, per_workload=1)
    export_json(db, dev, tmp_path / "out")
    with pytest.raises(UserInputError, match="exist; export into an empty folder"):
        export_json(db, dev, tmp_path / "out")
    with pytest.raises(UserInputError, match="target llvm, not the cuda device"):
        import_json(db, dev, "cuda", tmp_path / "out")


def test_cli_export_import(tmp_path, cpu_device, capsys, monkeypatch):
    monkeypatch.setattr(cli.out, "width", 250)  # no wrapping inside table cells
    src = tmp_path / "src.db"
    _fill(TuningDatabase(str(src)), cpu_device, per_workload=2)
    out = tmp_path / "ms"
    assert cli.main(["db", "export", "--db", str(src), "-o", str(out)]) == 0
    assert "exported 4 records of 2 workloads" in capsys.readouterr().out
    dst = tmp_path / "dst.db"
    assert cli.main(["db", "init", "--db", str(dst)]) == 0
    assert cli.main(["db", "import", "--db", str(dst), str(out)]) == 0
    assert "imported 4 new records of 2 workloads" in capsys.readouterr().out
    assert cli.main(["db", "best", "--db", str(dst)]) == 0
    text = capsys.readouterr().out
    assert "matmul(float32[32, 32]" in text and "add(float32[64]" in text
    assert cli.main(["db", "prune", "--db", str(dst), "--keep-top", "1"]) == 0
    assert "deleted 2 records" in capsys.readouterr().out
    assert cli.main(["db", "stats", "--db", str(dst)]) == 0
    assert "2 records (0 failed)" in capsys.readouterr().out
    # Bad input: one line, exit 2.
    assert cli.main(["db", "stats", "--db", str(tmp_path / "missing.db")]) == 2
    err = capsys.readouterr().err
    assert "no tuning database at" in err and "nightshift db init" in err
    assert not (tmp_path / "missing.db").exists()
    assert cli.main(["db", "best", "--db", str(dst), "--device", "cuda:0", "--target-arch", "sm_90"]) == 2
    assert "no records for cuda:0" in capsys.readouterr().err
