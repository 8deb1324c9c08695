"""A database a team can trust: validated traces, honest provenance, sane timings, housekeeping."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import tvm
from dbtest_utils import EMPTY_RECORD, add_mod, fake_cpu, matmul_mod
from tvm import te
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord, Workload

from tuner import cli
from tuner.compile import fallback_record
from tuner.db import NewRecord, TuningDatabase
from tuner.db.interop import RECORD_FILE, WORKLOAD_FILE, import_json
from tuner.db.store import IMPLAUSIBLE
from tuner.db.tvm_adapter import MetaScheduleDatabase
from tuner.db.validate import device_peak_flops, record_rejection, stored_target_has_amx, timing_rejection
from tuner.graph.keys import workload_key

EVIL_IR = "; ModuleID = 'evil'\ndefine void @owned() {\n  call void @system()\n  ret void\n}\n"


def _record(mod, target, secs: list[float]) -> list:
    """A real record of ``mod``: its fallback schedule's trace, with timings."""
    record, _ = fallback_record(Workload(mod), target)
    data = record.as_json()
    data[1] = secs
    return data


def _inject(mod, target, secs: list[float]) -> list:
    """A record whose trace annotates a loop ``pragma_import_llvm``: TVM links that IR into the module.

    Made with TVM's own schedule API, as an attacker would: the fallback schedule, then the pragma.
    """
    record, _ = fallback_record(Workload(mod), target)
    sch = Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    block = sch.get_sblock("b")
    sch.annotate(sch.get_loops(block)[0], "pragma_import_llvm", EVIL_IR)
    data = TuningRecord(sch.trace, Workload(mod), secs, target, record.args_info).as_json()
    return data


def test_injected_llvm_pragma_never_gets_through(db_url, cpu_device, tmp_path):
    mod = add_mod(64, "victim")
    key = workload_key(mod)
    honest = _record(mod, cpu_device.target, [4e-6])
    evil = _inject(mod, cpu_device.target, [1e-7])
    # The attack is real: TVM itself replays the trace and the pragma lands in the module.
    sch = Schedule(mod)
    TuningRecord.from_json(evil, Workload(mod)).trace.apply_to_schedule(sch, remove_postproc=False)
    assert "pragma_import_llvm" in sch.mod.script()
    assert "pragma_import_llvm" in record_rejection(json.dumps(evil))

    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.workload_id(key, "victim", mod, 64.0)
    # Someone with write access stores the faster-looking malicious record, by SQL
    # (add_records refuses it: test_the_payload_is_refused_on_write).
    _plant(db, dev, key, "evil", json.dumps(evil), 1e-7)
    adapter = MetaScheduleDatabase(db, dev, read_only=True, fallback=lambda w: fallback_record(w, cpu_device.target))
    got = adapter.get_top_k(Workload(mod), 1)
    assert adapter.decisions[key].kind == "fallback"  # not the malicious record
    assert all("pragma_import" not in str(r.trace) for r in got)
    assert any("pragma_import_llvm" in reason for reason in db.rejected.values())
    assert adapter.get_all_tuning_records() == []
    # With an honest record beside it, the honest one is used, though slower.
    db.add_records(dev, None, [NewRecord(key, "honest", json.dumps(honest), [4e-6])])
    got = adapter.get_top_k(Workload(mod), 1)
    assert adapter.decisions[key].kind == "tuned" and "pragma_import" not in str(got[0].trace)
    assert [r.run_secs[0].value for r in adapter.get_all_tuning_records()] == [pytest.approx(4e-6)]

    # Import: a MetaSchedule JSON database carrying the injection is refused line by line.
    folder = tmp_path / "ms"
    folder.mkdir()
    src = JSONDatabase(str(folder / WORKLOAD_FILE), str(folder / RECORD_FILE), allow_missing=True)
    wl = src.commit_workload(mod)
    src.commit_tuning_record(TuningRecord.from_json(evil, wl))
    src.commit_tuning_record(TuningRecord.from_json(_record(mod, cpu_device.target, [3e-6]), wl))
    other = db.device_id(fake_cpu(cpu_device, model="imported box"))
    res = import_json(db, other, "cpu", folder)
    assert res.records == 1 and len(res.rejected) == 1 and "pragma_import_llvm" in res.rejected[0][1]
    with db.session(write=False) as s:
        stored = s.execute(sa.text("SELECT record_json FROM records WHERE device_id = :d"), {"d": other}).scalars()
        assert all("pragma_import" not in r for r in stored)


def test_implausible_timings_are_refused_on_write(db_url, cpu_device):
    mod = matmul_mod(64)
    key = workload_key(mod)
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.workload_id(key, "matmul", mod, 2 * 64**3)
    trace = json.dumps(_record(mod, cpu_device.target, [1e-4]))
    db.add_records(dev, None, [NewRecord(key, "roofline", trace, [1e-12]),  # 5e17 FLOP/s on 2 cores
                               NewRecord(key, "ms-failed", trace, [1e9, 1e9]),  # MetaSchedule's failure value
                               NewRecord(key, "real", trace, [2e-4])])  # fmt: skip
    # MetaSchedule's own commits (tune_tir through the adapter) go through the same check.
    adapter = MetaScheduleDatabase(db, dev)
    adapter.commit_tuning_record(TuningRecord.from_json(_record(mod, cpu_device.target, [1e9]), Workload(mod)))
    assert [r.point for r in db.best(key, dev, k=5)] == ["real"]
    with db.engine.connect() as conn:
        refused = conn.execute(sa.text("SELECT error_class, error_msg FROM records WHERE mean_sec IS NULL")).all()
    assert len(refused) == 3 and {r.error_class for r in refused} == {IMPLAUSIBLE}
    assert any("peak" in r.error_msg for r in refused) and any("failure value" in r.error_msg for r in refused)


def test_an_amx_cpu_may_time_above_the_avx512_bound():
    """AMX tiles multiply 4x AVX-512 VNNI's uint8 pairs a cycle: a 3x3 int8 conv of ResNet-50
    (0.23 GOP) in 62 us on two cores (3.7 TOP/s, measured on an AMX Xeon) is plausible there,
    not on a CPU without tiles; a stored target says which (its mcpu, or mattr where LLVM's
    name for the CPU lacks them)."""
    rocketlake_amx = {"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-tile", "+amx-int8", "+amx-bf16"]}
    assert stored_target_has_amx(json.dumps({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert stored_target_has_amx(json.dumps(rocketlake_amx))
    assert not stored_target_has_amx(json.dumps({"kind": "llvm", "mcpu": "znver4"}))
    assert not stored_target_has_amx(json.dumps({"kind": "cuda", "arch": "sm_90"}))
    assert not stored_target_has_amx("not json")
    flops, sec = 231e6, 62e-6
    assert timing_rejection(sec, flops, device_peak_flops("cpu", 2, amx=True)) is None
    assert "peak" in timing_rejection(sec, flops, device_peak_flops("cpu", 2))
    assert "peak" in timing_rejection(1e-9, flops, device_peak_flops("cpu", 2, amx=True))


def test_provenance_and_foreign_imports(db_url, cpu_device, tmp_path, capsys):
    mod = add_mod(64, "shared")
    key = workload_key(mod)
    folder = tmp_path / "ms"
    folder.mkdir()
    src = JSONDatabase(str(folder / WORKLOAD_FILE), str(folder / RECORD_FILE), allow_missing=True)
    src.commit_tuning_record(TuningRecord.from_json(_record(mod, cpu_device.target, [1e-6]), src.commit_workload(mod)))
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    res = import_json(db, dev, "cpu", folder, tvm_version="0.19.0")
    assert res.records == 1
    row = db.lookup(key, dev, replays=lambda r: True)[0].row
    assert (row.origin, row.tvm_version, row.source_tvm_version) == ("import", "0.19.0", "0.19.0")
    assert row.source_file == str((folder / RECORD_FILE).resolve()) and '"mcpu"' in row.source_device
    # Foreign records are used only by their own rule: after a replay check, never as measured.
    assert db.lookup(key, dev) == []
    adapter = MetaScheduleDatabase(db, dev, read_only=True)
    assert adapter.get_top_k(Workload(mod), 1) and adapter.decisions[key].kind == "foreign"
    assert "imported from" in adapter.decisions[key].detail
    db_arg = db_url if not db_url.startswith("sqlite") else db_url.removeprefix("sqlite:///")
    assert cli.main(["db", "best", "--db", db_arg]) == 0
    assert "FOREIGN" in capsys.readouterr().out
    # A record measured here wins over the foreign one, though slower, and says who wrote it.
    db.add_records(dev, None, [NewRecord(key, "mine", json.dumps(_record(mod, cpu_device.target, [5e-6])), [5e-6])])
    best = adapter.db.lookup(key, dev, replays=lambda r: True)[0]
    assert best.source == "device" and best.row.point == "mine"
    assert best.row.origin == "local" and best.row.os_user and best.row.nightshift_version and best.row.host
    assert cli.main(["db", "best", "--db", db_arg, "--workload", key]) == 0
    assert "this device" in capsys.readouterr().out


def test_identical_devices_are_looked_up_together(db_url, cpu_device):
    mod = add_mod(16)
    key = workload_key(mod)
    db = TuningDatabase(db_url)
    db.workload_id(key, "add", mod, 16.0)
    me = db.device_id(cpu_device)
    # The same machine type whose hypervisor hides an ISA flag: another fingerprint, same class.
    twin_dev = fake_cpu(cpu_device)
    twin_dev.description["isa_flags"] = [f for f in twin_dev.description.get("isa_flags", []) if f != "f16c"] + ["x"]
    twin = db.device_id(twin_dev)
    assert twin != me
    rec = json.dumps(_record(mod, cpu_device.target, [1e-6]))
    db.add_records(me, None, [NewRecord(key, "mine-slow", rec, [9e-6])])
    db.add_records(twin, None, [NewRecord(key, "twin-fast", rec, [2e-6])])
    found = db.lookup(key, me, k=2)
    assert [(b.row.point, b.source) for b in found] == [("twin-fast", "device"), ("mine-slow", "device")]


def test_dead_jobs(db_url, cpu_device, capsys):
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    live, killed, silent = (db.start_job(m, dev, {}, 4) for m in ("live", "killed", "silent"))
    now = datetime.now(UTC).replace(tzinfo=None)
    with db.engine.begin() as conn:
        for job, beat, updated in ((live, now, now), (killed, now - timedelta(minutes=30), now),
                                   (silent, None, now - timedelta(hours=2))):  # fmt: skip
            conn.execute(sa.text("UPDATE jobs SET heartbeat_at = :b, updated_at = :u WHERE id = :j"),
                         {"b": beat, "u": updated, "j": job})
    assert {j.model: state for j, state in db.jobs()} == {"live": "running", "killed": "dead", "silent": "dead"}
    assert db.stats()["jobs"] == {"running": 1, "dead": 2}
    db_arg = db_url if not db_url.startswith("sqlite") else db_url.removeprefix("sqlite:///")
    assert cli.main(["db", "jobs", "--db", db_arg]) == 0
    assert capsys.readouterr().out.count("dead") == 2


def test_prune_by_tvm_version_and_age_asks_first(db_url, cpu_device, capsys):
    mod = add_mod(8)
    key = workload_key(mod)
    db = TuningDatabase(db_url)
    db.workload_id(key, "add", mod, 8.0)
    dev = db.device_id(cpu_device)
    db.add_records(dev, None, [NewRecord(key, f"p{i}", "[[[], []], null, null, null]", [1e-3 * (i + 1)])
                               for i in range(6)])  # fmt: skip
    old = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=90)
    with db.engine.begin() as conn:  # two records of an old TVM, one of them also old
        conn.execute(sa.text("UPDATE records SET tvm_version = '0.21.0' WHERE point IN ('p0', 'p1')"))
        conn.execute(sa.text("UPDATE records SET created_at = :t WHERE point IN ('p1', 'p2')"), {"t": old})
    # keep-top ranks each TVM version apart: the old version's best record survives too.
    assert db.prune(keep_top=1, dry_run=True).deleted == 4
    assert db.prune(tvm_version="0.21.0", dry_run=True).deleted == 2
    assert db.prune(older_than=timedelta(days=30), dry_run=True).deleted == 2
    assert db.prune(tvm_version="0.21.0", older_than=timedelta(days=30)).deleted == 1
    db_arg = db_url if not db_url.startswith("sqlite") else db_url.removeprefix("sqlite:///")
    # --keep-top 0 (and any prune deleting more than it keeps) is refused without --yes.
    for argv in (["--keep-top", "0"], ["--keep-top", "1"]):
        assert cli.main(["db", "prune", "--db", db_arg, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--yes" in err
    assert db.count_records() == 5
    assert cli.main(["db", "prune", "--db", db_arg, "--tvm-version", "0.21.0"]) == 0
    assert "deleted 1 records; 4 kept" in capsys.readouterr().out
    assert cli.main(["db", "prune", "--db", db_arg, "--keep-top", "0", "--yes"]) == 0
    assert db.count_records() == 0



def _fused_pixel_point(target) -> tuple:
    """A small conv and a template point of it whose trace carries index maps (the
    ``transform_layout`` and ``transform_block_layout`` of the fused pixel axis) and the
    partition hint of its shorter last tile (49 pixels in tiles of 5)."""
    import tvm
    from tvm import te, topi

    from search_spaces import Point, TemplateSpace

    data = te.placeholder((1, 2, 7, 7, 8), name="data")
    kernel = te.placeholder((2, 2, 3, 3, 8, 8), name="kernel")
    with tvm.target.Target({"kind": "llvm"}):
        conv = topi.nn.conv2d_NCHWc(data, kernel, 1, 1, 1, layout="NCHW8c", out_layout="NCHW8c")
    mod = tvm.IRModule({"main": te.create_prim_func([data, kernel, topi.nn.relu(conv)])})
    space = TemplateSpace(mod, target, "x86-conv2d-nchwc")
    named = {"reg_n": 5, "tile_oh": 1, "tile_oc": 1, "tile_ic": 8, "order": 0, "unroll_kw": 1,
             "parallel_depth": 2, "pad_inline": 0, "fuse_pixels": 1}
    return mod, space.apply(Point(0, tuple(named.get(k.name, k.choices[0]) for k in space.knobs(0))))


def test_traces_with_index_maps_are_stored_and_replayed(db_url, cpu_device):
    """A trace with index maps is written as TVM's own JSON database writes it, passes the
    allow-list, and replays from the tuning database into the same program."""
    import tvm

    from tuner.search.remote import trace_json
    from tuner.trace_json import record_as_json

    mod, sch = _fused_pixel_point(cpu_device.target)
    record = TuningRecord(sch.trace, Workload(mod), [2e-5], cpu_device.target, None)
    text = json.dumps(record_as_json(record))
    assert json.dumps(trace_json(sch)) == json.dumps(json.loads(text)[0])  # what a job stores
    assert '"TransformBlockLayout"' in text and "tirx.IndexMap" in text and "pragma_loop_partition_hint" in text
    assert record_rejection(text) is None
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    key = workload_key(mod)
    db.workload_id(key, "conv", mod, 1.0)
    db.add_records(dev, None, [NewRecord(key, "fused", text, [2e-5])])
    adapter = MetaScheduleDatabase(db, dev, read_only=True)
    (got,) = adapter.get_top_k(Workload(mod), 1)
    replayed = Schedule(mod)
    got.trace.apply_to_schedule(replayed, remove_postproc=False)
    tvm.ir.assert_structural_equal(replayed.mod, sch.mod)


def test_tvm_json_inputs_are_index_maps_of_integer_arithmetic_only(cpu_device):
    """TVM loads an input string that starts with "{" as any object of TVM JSON: only an
    index map of variables and integer arithmetic, in a layout instruction, gets through."""
    from tuner.trace_json import record_as_json

    mod, sch = _fused_pixel_point(cpu_device.target)
    data = record_as_json(TuningRecord(sch.trace, Workload(mod), [2e-5], cpu_device.target, None))
    layout = next(inst for inst in data[0][0] if inst[0] == "TransformLayout")
    n, text = next((n, x) for n, x in enumerate(layout[1]) if isinstance(x, str) and x.startswith("{"))
    graph = json.loads(text)

    def with_map(new: str, kind: str = "TransformLayout") -> str:
        bad = json.loads(json.dumps(data))
        inst = next(i for i in bad[0][0] if i[0] == "TransformLayout")
        inst[0], inst[1][n] = kind, new
        return json.dumps(bad)

    call = json.loads(text)
    call["nodes"].append({"type": "tirx.Call", "data": {}})
    assert "tirx.Call" in record_rejection(with_map(json.dumps(call)))
    named = json.loads(text)
    next(x for x in named["nodes"] if x["type"] == "ffi.String")["data"] = "x; import os"
    assert "disallowed name" in record_rejection(with_map(json.dumps(named)))
    not_a_map = dict(graph, root_index=next(i for i, x in enumerate(graph["nodes"]) if x["type"] == "ir.Var"))
    assert "not an index map" in record_rejection(with_map(json.dumps(not_a_map)))
    assert "only an index map" in record_rejection(with_map(text, kind="Split"))
    assert record_rejection(with_map(text)) is None
    block_layout = next(inst for inst in data[0][0] if inst[0] == "TransformBlockLayout")
    assert block_layout[2][0].lstrip().startswith("{")  # TVM writes this one's map as an attribute
    block_layout[2][0] = json.dumps(call)
    assert "tirx.Call" in record_rejection(json.dumps(data))


def test_a_record_of_a_same_key_function_with_other_block_names_is_passed_over(db_url, cpu_device, caplog):
    """A workload key is TVM's structural hash, which ignores block names: two functions that
    differ only in them share a key (BERT's int8 layer norm, quantized by two recipes). The
    fastest record's trace gets its block by a name the other function lacks; looking the other
    up returns its own record, with a warning, instead of failing the compile."""
    from tuner.trace_json import record_as_json

    def add(block: str):
        a = te.placeholder((64,), name="a")
        b = te.compute((64,), lambda i: a[i] + 1, name=block)
        return tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", "add")})

    def record(mod, block: str, sec: float) -> str:
        sch = Schedule(mod)
        outer, _ = sch.split(sch.get_loops(sch.get_sblock(block))[0], factors=[None, 16])
        sch.parallel(outer)
        return json.dumps(record_as_json(TuningRecord(sch.trace, Workload(mod), [sec], cpu_device.target, None)))

    mod_b, mod_c = add("b"), add("c")
    key = workload_key(mod_b)
    assert workload_key(mod_c) == key
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.workload_id(key, "add_b", mod_b, 1.0)
    db.add_records(dev, None, [NewRecord(key, "b-fast", record(mod_b, "b", 1e-6), [1e-6]),
                               NewRecord(key, "c-slow", record(mod_c, "c", 2e-6), [2e-6])])  # fmt: skip
    adapter = MetaScheduleDatabase(db, dev, read_only=True)
    with caplog.at_level("WARNING", logger="tuner.db.tvm_adapter"):
        (got,) = adapter.get_top_k(Workload(mod_c), 1)
    assert [float(s) for s in got.run_secs] == [2e-6]
    got.trace.apply_to_schedule(Schedule(mod_c), remove_postproc=False)
    assert "does not apply to" in caplog.text and "shares its workload key" in caplog.text
    (fast,) = adapter.get_top_k(Workload(mod_b), 1)
    assert [float(s) for s in fast.run_secs] == [1e-6]


def test_an_empty_tensorize_annotation_passes_and_nothing_else_empty_does():
    """MetaSchedule annotates a tensorized reduction's init block with auto_tensorize "" (its
    VNNI sketches of a uint8 x int8 matmul): such a record must be usable at compile time."""

    def record(key: str, value: str) -> str:
        insts = [["GetSBlock", [], ["compute", "main"], ["b0"]], ["Annotate", ["b0", json.dumps(value)], [key], []]]
        trace = [insts, []]
        return json.dumps([trace, [1e-5], {"kind": "llvm"}, []])

    assert record_rejection(record("meta_schedule.auto_tensorize", "")) is None
    assert record_rejection(record("meta_schedule.auto_tensorize_init", "")) is None
    assert record_rejection(record("meta_schedule.auto_tensorize", "dot_16x4_vnni")) is None
    assert "disallowed value" in record_rejection(record("meta_schedule.cache_type", ""))
    assert "disallowed value" in record_rejection(record("meta_schedule.auto_tensorize", "a b"))


# --- The one gate: a record that runs native code when loaded, planted by SQL ---------------
# A database writer can put any row in the records table, around add_records' checks. The
# payload is real: LLVM IR linked into the kernel by `pragma_import_llvm`, whose load-time
# constructor (llvm.global_ctors) creates a marker file. TVM gives the imported IR's functions
# available_externally linkage (their bodies are dropped), so the constructor is module-level
# assembly, as an attacker would write it. x86-64 Linux, the project's hosts.


def _payload_ir(marker: Path) -> str:
    asm = [".text", ".globl nightshift_payload", ".hidden nightshift_payload", ".type nightshift_payload,@function",
           "nightshift_payload:", "push %rbx", "lea nightshift_marker(%rip), %rdi", "lea nightshift_mode(%rip), %rsi",
           "call fopen@PLT", "test %rax, %rax", "je 1f", "mov %rax, %rdi", "call fclose@PLT", "1:", "pop %rbx", "ret",
           ".section .rodata", f'nightshift_marker: .asciz "{marker}"', 'nightshift_mode: .asciz "w"',
           ".text"]  # fmt: skip
    return "".join('module asm "' + line.replace('"', "\\22") + '"\n' for line in asm) + (
        "@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] "
        "[{ i32, ptr, ptr } { i32 65535, ptr @nightshift_payload, ptr null }]\n"
        "declare void @nightshift_payload()\n"
    )


def _payload_record(mod, target, marker: Path, secs: list[float]) -> str:
    """A record of ``mod`` (its fallback schedule) whose first loop carries the payload."""
    from tuner.trace_json import record_as_json

    record, _ = fallback_record(Workload(mod), target)
    sch = Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    block = sch.get_child_blocks(sch.get_sblock("root"))[0]
    sch.annotate(sch.get_loops(block)[0], "pragma_import_llvm", _payload_ir(marker))
    return json.dumps(record_as_json(TuningRecord(sch.trace, Workload(mod), secs, target, record.args_info)))


def _plant(db: TuningDatabase, dev: int, key: str, point: str, record_json: str, mean_sec: float | None,
           error_class: str | None = None) -> None:  # fmt: skip
    """The attack of a database writer: a row stored by SQL, around add_records' checks."""
    db.add_records(dev, None, [NewRecord(key, point, EMPTY_RECORD, [1.0])])
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE records SET record_json = :j, mean_sec = :m, run_secs = :r, error_class = :e "
                             "WHERE point = :p"),
                     {"j": record_json, "m": mean_sec, "r": json.dumps([mean_sec]), "e": error_class, "p": point})


@pytest.fixture(scope="module")
def tiny_tasks(cpu_device):
    """The zoo's tiny model and its tasks; the payload goes into its small matmul's record."""
    from tuner.frontends import load_model
    from tuner.graph.tasks import extract_tasks

    spec = load_model("tiny")
    tasks = extract_tasks(spec.bound(), cpu_device.target)
    return spec, tasks, next(t for t in tasks if "matmul" in t.name)


def test_the_payload_runs_native_code_on_load_when_nothing_checks_it(tiny_tasks, cpu_device, tmp_path):
    """The control: replayed, built and loaded as rerank_task did before the gate, the record
    runs its constructor on this host."""
    import tvm_ffi

    from tuner.measure.builder import build_candidate

    _, _, task = tiny_tasks
    marker = tmp_path / "owned"
    text = _payload_record(task.mod, cpu_device.target, marker, [1e-7])
    sch = Schedule(task.mod)
    TuningRecord.from_json(json.loads(text), Workload(task.mod)).trace.apply_to_schedule(sch, remove_postproc=False)
    built = build_candidate(tvm.ir.save_json(sch.mod), dict(cpu_device.target.export()))
    assert built.artifact is not None and not marker.exists()
    (tmp_path / "lib.so").write_bytes(built.artifact)
    tvm_ffi.load_module(str(tmp_path / "lib.so"))
    assert marker.exists(), "the payload did not run: the tests below would prove nothing"


def _gated_db(db_url, cpu_device, task, marker: Path, *, failed: bool = False) -> tuple[TuningDatabase, int]:
    """Two honest records of ``task`` (20 and 30 us) and the payload planted as the fastest (1 us)."""
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.workload_id(task.workload_key, task.name, task.mod, task.flops)
    honest = json.dumps(_record(task.mod, cpu_device.target, [2e-5]))
    db.add_records(dev, None, [NewRecord(task.workload_key, "honest-a", honest, [2e-5]),
                               NewRecord(task.workload_key, "honest-b", honest, [3e-5])])  # fmt: skip
    evil = _payload_record(task.mod, cpu_device.target, marker, [1e-6])
    _plant(db, dev, task.workload_key, "evil", evil, None if failed else 1e-6, "build_error" if failed else None)
    return db, dev


READERS = ["lookup", "db-best", "db-best-workload", "compile", "rerank", "pretrain", "export", "warm-start"]


@pytest.mark.parametrize("reader", READERS)
def test_a_planted_payload_is_refused_by_every_reader(reader, db_url, tiny_tasks, cpu_device, tmp_path, caplog):
    """Each path that applies a stored trace reads the planted record through the gate, passes
    it over, says so once, and its constructor never runs."""
    spec, _, task = tiny_tasks
    marker = tmp_path / "owned"
    db, dev = _gated_db(db_url, cpu_device, task, marker)
    key = task.workload_key
    caplog.set_level("WARNING")
    if reader == "lookup":
        assert [b.row.point for b in db.lookup(key, dev, k=3)] == ["honest-a", "honest-b"]
        assert [r.point for r in db.best(key, dev, k=3)] == ["honest-a", "honest-b"]
        assert [r.point for _, r, _ in db.best_per_workload(dev)] == ["honest-a"]
        assert sorted(r.point for _, r in db.successful_records(dev)) == ["honest-a", "honest-b"]
    elif reader.startswith("db-best"):
        arg = db_url if not db_url.startswith("sqlite") else db_url.removeprefix("sqlite:///")
        one = ["--workload", key] if reader == "db-best-workload" else []
        assert cli.main(["db", "best", "--db", arg, *one]) == 0
    elif reader == "compile":
        from tuner.compile import compile_model, run_model

        compiled = compile_model(spec, cpu_device, db)
        assert compiled.decisions[key].kind == "tuned" and compiled.decisions[key].detail == "0.020 ms"
        run_model(compiled, cpu_device, spec.random_inputs(), budget_s=0.05)
    elif reader == "rerank":
        from tuner.measure.runner import TimingConfig
        from tuner.rerank import rerank_task

        done = rerank_task(db, task, dev, cpu_device.target, "warm", TimingConfig(repeat=1, min_repeat_ms=1), top=3,
                           rounds=2)  # fmt: skip
        assert done is not None and done.retimed == 2
    elif reader == "pretrain":
        from cost_models.dataset import load_dataset

        assert len(load_dataset(db, cpu_device)) == 2
    elif reader == "export":
        from tuner.db.interop import export_json

        assert export_json(db, dev, tmp_path / "out").records == 2
        assert "pragma_import" not in (tmp_path / "out" / RECORD_FILE).read_text()
    elif reader == "warm-start":
        from tuner.db.store import REFUSED, measured_results
        from tuner.reuse import task_histories

        told = {p: (m, e) for p, m, e in measured_results(db, key, dev)}
        assert told["evil"] == (None, REFUSED) and told["honest-a"] == (pytest.approx(2e-5), None)
        (history,) = task_histories(db, dev, -1, [key]).values()
        assert history.best_sec == pytest.approx(2e-5)
    assert not marker.exists()
    # (the command line reads through a database of its own)
    assert reader.startswith("db-best") or any("pragma_import_llvm" in r for r in db.rejected.values())
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "pragma_import_llvm" in refusals[0], refusals


def test_a_planted_payload_in_a_failed_record_is_not_featurized(db_url, tiny_tasks, cpu_device, tmp_path):
    """Pre-training replays failed records too (labelled 0): a failure carries no free pass."""
    from cost_models.dataset import load_dataset

    _, _, task = tiny_tasks
    db, dev = _gated_db(db_url, cpu_device, task, tmp_path / "owned", failed=True)
    assert len(load_dataset(db, cpu_device)) == 2
    assert sorted(r.point for _, _, r in db.training_records(dev)) == ["honest-a", "honest-b"]


def test_the_payload_is_refused_on_write(db_url, tiny_tasks, cpu_device, tmp_path, caplog):
    """add_records (and the adapter MetaSchedule commits through) and import refuse the
    payload before anything parses it: stored as a failure without its trace, or not at all."""
    from tuner.db.store import IMPLAUSIBLE

    _, _, task = tiny_tasks
    marker = tmp_path / "owned"
    evil = _payload_record(task.mod, cpu_device.target, marker, [1e-6])
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.workload_id(task.workload_key, task.name, task.mod, task.flops)
    with caplog.at_level("WARNING"):
        db.add_records(dev, None, [NewRecord(task.workload_key, "evil", evil, [1e-6])])
    assert sum("refused 1 of 1 records on write" in r.getMessage() for r in caplog.records) == 1
    adapter = MetaScheduleDatabase(db, dev)
    adapter.commit_tuning_record(TuningRecord.from_json(json.loads(evil), Workload(task.mod)))
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT error_class, mean_sec, record_json FROM records")).all()
    assert len(rows) == 2 and all(r.error_class == "refused_trace" and r.mean_sec is None for r in rows)
    assert all("pragma_import" not in r.record_json for r in rows) and IMPLAUSIBLE not in {r.error_class for r in rows}
    folder = tmp_path / "ms"
    folder.mkdir()
    src = JSONDatabase(str(folder / WORKLOAD_FILE), str(folder / RECORD_FILE), allow_missing=True)
    src.commit_tuning_record(TuningRecord.from_json(json.loads(evil), src.commit_workload(task.mod)))
    res = import_json(db, db.device_id(fake_cpu(cpu_device, model="imported box")), "cpu", folder)
    assert res.records == 0 and "pragma_import_llvm" in res.rejected[0][1]
    assert not marker.exists()


def test_impossible_timings_set_by_sql_are_never_selected(db_url, tiny_tasks, cpu_device, tmp_path, caplog, capsys):
    """Times no device reaches, written by SQL: -1 s and 1e-12 s on the matmul, 1e-15 s on a
    zero-FLOP layout transform (its floor: its output's bytes at the device's bandwidth). The
    compiler, ``db best``, the job's scheduler and warm start, and the layout plan pass them
    over and each says so once."""
    from tuner.compile import compile_model
    from tuner.db.store import REFUSED, measured_results
    from tuner.reuse import rule, task_histories

    spec, tasks, matmul = tiny_tasks
    transform = next(t for t in tasks if t.name.startswith("layout_transform") and t.flops == 0)
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    honest = {}
    for t in (matmul, transform):
        db.workload_id(t.workload_key, t.name, t.mod, t.flops)
        honest[t.workload_key] = json.dumps(_record(t.mod, cpu_device.target, [2e-5]))
        db.add_records(dev, None, [NewRecord(t.workload_key, f"honest-{t.name}", honest[t.workload_key], [2e-5])])
    _plant(db, dev, matmul.workload_key, "negative", honest[matmul.workload_key], -1.0)
    _plant(db, dev, matmul.workload_key, "roofline", honest[matmul.workload_key], 1e-12)
    _plant(db, dev, transform.workload_key, "zero-flop", honest[transform.workload_key], 1e-15)
    caplog.set_level("WARNING")

    def said_once(reader: str) -> None:
        refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1 and refusals[0].startswith(reader), refusals
        caplog.clear()

    compiled = compile_model(spec, cpu_device, db)
    assert {compiled.decisions[t.workload_key].detail for t in (matmul, transform)} == {"0.020 ms"}
    said_once("compile")
    assert {db.rejected[i].split(" s ")[0] for i in db.rejected} == {
        "mean time -1.0", "mean time 1e-12", "mean time 1e-15"}  # fmt: skip
    assert any("not a positive number" in r for r in db.rejected.values())
    assert any("GFLOP/s" in r for r in db.rejected.values()) and any("GB/s" in r for r in db.rejected.values())

    arg = db_url if not db_url.startswith("sqlite") else db_url.removeprefix("sqlite:///")
    assert cli.main(["db", "best", "--db", arg]) == 0
    out = capsys.readouterr().out
    assert "0.0200" in out and "-1000" not in out and "1e-" not in out
    said_once("best per workload")

    # The scheduler starts from the honest best, and the search is told the others failed.
    fresh = TuningDatabase(db_url)
    (history,) = task_histories(fresh, dev, -1, [matmul.workload_key]).values()
    assert history.best_sec == pytest.approx(2e-5)
    assert "best 0.02 ms; warm start" in rule(history, skip_after=0, fresh=False)[1]
    # Successes the gate refuses count in the SQL tally, but without a best that passes, a
    # task is tuned, not skipped.
    planted_only = dataclasses.replace(history, best_sec=None)
    assert rule(planted_only, skip_after=1, fresh=False)[0] == "warm"
    assert rule(history, skip_after=1, fresh=False)[0] == "skip"
    said_once("best")
    told = {p: (m, e) for p, m, e in measured_results(fresh, matmul.workload_key, dev)}
    assert told["negative"] == told["roofline"] == (None, REFUSED)
    assert not [r for r in caplog.records if "refused" in r.getMessage()], "said once per database, not per reader"
    # On write, the zero-FLOP floor holds too.
    fresh.add_records(dev, None, [NewRecord(transform.workload_key, "zero-flop-2", honest[transform.workload_key],
                                            [1e-15])])  # fmt: skip
    assert [r.point for r in fresh.best(transform.workload_key, dev, k=5)] == [f"honest-{transform.name}"]
    # Pruning to the fastest record of each workload keeps the honest ones, not the planted
    # times that rank first; the planted rows go, and so does the write refused above (a failure).
    pruned = TuningDatabase(db_url)
    assert pruned.prune(keep_top=1).deleted == 4  # the three planted rows and the refused write
    with pruned.engine.connect() as conn:
        left = set(conn.execute(sa.text("SELECT point FROM records")).scalars())
    assert left == {f"honest-{matmul.name}", f"honest-{transform.name}"}


def test_the_layout_plan_ignores_impossible_timings(db_url, cpu_device, caplog):
    """Both convs are faster blocked (NCHW8c); a -1 s record set by SQL on each NCHW conv would
    switch the plan to NCHW. The plan is chosen from the honest records."""
    from tvm.s_tir.meta_schedule.database import Workload

    from tuner.app.plan import choose_layout
    from tuner.frontends import load_model
    from tuner.graph.tasks import extract_layout_tasks

    spec = load_model("tiny")
    tasks = extract_layout_tasks(spec.bound(), cpu_device.target, ("NCHW8c", "NCHW"))
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    for t in tasks:
        db.workload_id(t.workload_key, t.name, t.mod, t.flops)
        text = json.dumps(fallback_record(Workload(t.mod), cpu_device.target)[0].as_json())
        sec = 2e-5 if not t.layout else (1e-4 if t.layout == "NCHW8c" else 6e-4)
        db.add_records(dev, None, [NewRecord(t.workload_key, "fallback", text, [sec])])
        if t.layout == "NCHW":
            _plant(db, dev, t.workload_key, f"fake-{t.workload_key}", text, -1.0)
    caplog.set_level("WARNING")
    choice = choose_layout(spec, cpu_device, db, ("NCHW8c", "NCHW"))
    assert set(choice.plan.layouts or (choice.plan.default,)) == {"NCHW8c"} and choice.seconds > 0
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].startswith("layout plan: 2 stored record(s) refused"), refusals


def test_a_record_rewritten_after_it_passed_is_checked_again(db_url, tiny_tasks, cpu_device, tmp_path):
    """The gate does not parse a trace twice while its text is unchanged, but a row rewritten by
    SQL between two reads (during a long job, before its re-ranking) is checked again."""
    _, _, task = tiny_tasks
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.workload_id(task.workload_key, task.name, task.mod, task.flops)
    honest = json.dumps(_record(task.mod, cpu_device.target, [2e-5]))
    db.add_records(dev, None, [NewRecord(task.workload_key, "honest", honest, [2e-5])])
    assert [r.point for r in db.best(task.workload_key, dev)] == ["honest"]
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE records SET record_json = :j"),
                     {"j": _payload_record(task.mod, cpu_device.target, tmp_path / "owned", [2e-5])})
    assert db.best(task.workload_key, dev) == []
    assert "pragma_import_llvm" in next(iter(db.rejected.values()))
