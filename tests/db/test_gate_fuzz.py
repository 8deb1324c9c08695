"""Fuzzing the one gate (``tuner.db.validate.replay_rejection``, ``TuningDatabase.record_ok``):
random and adversarial records, mutated from real ones, fed to the checker and planted by SQL
under the database's readers. None crashes a reader, none reaches TVM's replay unchecked, and
what the gate lets through replays cleanly or fails with TVM's ordinary errors."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from dbtest_utils import matmul_mod
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from tuner.db import NewRecord, TuningDatabase
from tuner.db.validate import ALLOWED_ANNOTATIONS, ALLOWED_INSTRUCTIONS, record_rejection
from tuner.graph.keys import workload_key

# What TVM raises on a trace that does not fit its workload: the readers catch these.
REPLAY_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError)
CALL = '{"root_index": 1, "nodes": [{"type": "None"}, {"type": "tirx.Call", "data": {}}]}'
LLVM = 'module asm ".globl x"\n@llvm.global_ctors = appending global [0 x { i32, ptr, ptr }] []'
ADVERSARIAL = [
    2**31, 2**63, 2**80, -(2**80), 10**9, 1e300, -1, 0, 0.5, math.nan, math.inf, None, True,
    "{}", CALL, " " + CALL, "x" * 5000, '"pragma_import_llvm"', "pragma_import_llvm", "pragma_import_c",
    json.dumps(LLVM), "b0", "v1", "l2", "_", '"SSRSRS"', [], [[[[[[[[]]]]]]]], [CALL], [[CALL]], {"k": CALL},
    ["Annotate", ["b0", json.dumps(LLVM)], ["pragma_import_llvm"], []],
    ["Annotate", ["l2", 10**9], ["pragma_auto_unroll_max_step"], []],
    ["SampleCategorical", [], [[0, 10**9], [0.5, 0.5]], ["v9"]],
    ["UnsafeSetDType", ["b0", '"float64"'], [], []],
]  # fmt: skip
leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | st.sampled_from(ADVERSARIAL)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=4), inner, max_size=2), max_leaves=12)  # fmt: skip
# Values the gate lets through, so that mutated records also reach TVM's replay: small
# numbers, random variables' names, short lists of factors.
benign = (st.integers(-3, 1100) | st.sampled_from(["b0", "l2", "v5", "b1", "l4", "_", '"SSRSRS"', '"global"', None])
          | st.lists(st.integers(-2, 64), max_size=5))  # fmt: skip


@pytest.fixture(scope="module")
def real(cpu_device) -> tuple[Any, list[list]]:
    """The workload and real records of it: a sketch space's (with decisions), the fallback's."""
    import search_spaces
    from tuner.compile import fallback_record
    from tuner.trace_json import record_as_json

    mod = matmul_mod(16)
    space = search_spaces.create(mod, cpu_device.target, kind="sketch")
    rng = np.random.default_rng(0)
    out = [record_as_json(fallback_record(Workload(mod), cpu_device.target)[0])]
    for _ in range(3):
        sch = space.apply(space.sample(rng))
        out.append(record_as_json(TuningRecord(sch.trace, Workload(mod), [1e-5], cpu_device.target, None)))
    assert all(record_rejection(json.dumps(r)) is None for r in out), "the project's own records must pass"
    assert any(r[0][1] for r in out), "a record with decisions"
    return mod, out


def _paths(obj: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(obj, list):
        for i, x in enumerate(obj):
            out += _paths(x, (*path, i))
    return out


def _replace(obj: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = list(obj)
    copy[path[0]] = _replace(obj[path[0]], path[1:], new)
    return copy


@st.composite
def records(draw, base: list[list]) -> str:
    """A record's text: a real record with one to three values replaced (in its trace mostly),
    an instruction or a decision added, or noise that is not a record at all."""
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "instruction", "decision", "noise"]))
    if kind == "noise":
        return draw(st.sampled_from(["", "[", "null", "[" * 5000 + "]" * 5000, "[[], [1e999]]"]) | values.map(
            lambda v: json.dumps(v)))  # fmt: skip
    record = json.loads(json.dumps(draw(st.sampled_from(base))))
    if kind == "instruction":
        args = st.lists(benign, max_size=3) | values
        outputs = st.sampled_from([[], ["b9"], ["l9", "l10"]]) | values
        inst = [draw(st.sampled_from(sorted(ALLOWED_INSTRUCTIONS))), draw(args), draw(args), draw(outputs)]
        if draw(st.booleans()):
            inst = ["Annotate", [draw(st.sampled_from(["b0", "l2", "v5"])), draw(benign | values)],
                    [draw(st.sampled_from(sorted(ALLOWED_ANNOTATIONS)))], []]  # fmt: skip
        at = draw(st.integers(0, len(record[0][0])))
        record[0][0].insert(at, inst)
        return json.dumps(record)
    if kind == "decision":
        if record[0][1] and draw(st.booleans()):
            record[0][1][draw(st.integers(0, len(record[0][1]) - 1))][1] = draw(benign)
        else:
            record[0][1].append([draw(st.integers(-2, len(record[0][0]) + 2)), draw(values | benign)])
        return json.dumps(record)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(record[0])  # the trace: instructions and decisions
        path = draw(st.sampled_from(paths[1:]))
        record = [_replace(record[0], path, draw(benign | values)), *record[1:]]
    return json.dumps(record)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_the_gate_never_raises_and_what_it_passes_replays_cleanly(real, data):
    mod, base = real
    text = data.draw(records(base))
    reason = record_rejection(text)
    assert reason is None or isinstance(reason, str)
    event("refused" if reason is not None else "passed")
    if reason is not None:
        return
    try:
        record = TuningRecord.from_json(json.loads(text), Workload(mod))
        sch = Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except REPLAY_ERRORS as err:
        event(f"passed, then TVM refused it: {type(err).__name__}")
        return
    event("passed and replayed")
    assert "pragma_import" not in sch.mod.script()


def _first(trace: list, kind: str) -> int:
    return next(i for i, inst in enumerate(trace) if inst[0] == kind)


@pytest.mark.parametrize("mutation", [
    "split attribute None", "block name a number", "probability a list", "split loop None", "vectorize no loop",
])  # fmt: skip
def test_what_segfaulted_tvms_replay_is_refused(real, mutation):
    """Mutations the fuzzer found passing the gate and then killing the process in TVM's replay
    (TVM 0.27 takes an instruction's attribute types and first input on trust)."""
    _, base = real
    record = json.loads(json.dumps(base[-1]))
    trace = record[0][0]
    if mutation == "split attribute None":
        trace[_first(trace, "Split")][2][1] = None
    elif mutation == "block name a number":
        trace[_first(trace, "GetSBlock")][2] = [1, 1]
    elif mutation == "probability a list":
        trace[_first(trace, "SampleCategorical")][2][1][2] = [None, 0.5, None]
    elif mutation == "split loop None":
        trace[_first(trace, "Split")][1][0] = None
    else:
        trace[_first(trace, "Vectorize")][1] = []
    assert record_rejection(json.dumps(base[-1])) is None
    assert record_rejection(json.dumps(record)) is not None


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory, cpu_device, real) -> tuple[str, str, int]:
    mod, _ = real
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}"
    db = TuningDatabase(url)
    dev = db.device_id(cpu_device)
    key = workload_key(mod)
    db.workload_id(key, "matmul", mod, 2 * 16**3)
    db.close()
    return url, key, dev


times = st.sampled_from([2e-5, 1e-6, 1e-9, 1e-12, 1e-15, 0.0, -1.0, -1e-12, 1e9, 1e10, math.inf, math.nan]) | st.floats(
    -1, 1)  # fmt: skip


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_no_reader_crashes_or_selects_what_the_gate_refuses(fuzz_db, real, cpu_device, data):
    """Rows of fuzzed records and times, written by SQL beside an honest record (20 us): every
    reader returns, nothing it ranks or replays fails the gate, and the honest record is never
    beaten by a refused one."""
    from cost_models.dataset import load_dataset
    from tuner.db.store import measured_results
    from tuner.db.tvm_adapter import MetaScheduleDatabase
    from tuner.reuse import task_histories

    url, key, dev = fuzz_db
    mod, base = real
    planted = [(data.draw(records(base)), data.draw(times), data.draw(st.sampled_from([None, None, "build_error"])))
               for _ in range(3)]  # fmt: skip
    db = TuningDatabase(url)
    with db.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM records"))
    db.add_records(dev, None, [NewRecord(key, "honest", json.dumps(base[0]), [2e-5])]
                   + [NewRecord(key, f"fuzz{i}", "[[[], []], null, null, null]", [1.0]) for i in range(3)])
    with db.engine.begin() as conn:
        for i, (text, sec, error) in enumerate(planted):
            values_ = {"j": text, "m": None if error else sec, "e": error, "p": f"fuzz{i}"}
            conn.execute(sa.text("UPDATE records SET record_json = :j, mean_sec = :m, error_class = :e "
                                 "WHERE point = :p"), values_)
    floor = db.timing_floor(db._workload_ids_of({key})[key], dev)

    def usable(row) -> bool:
        return record_rejection(row.record_json) is None and floor.rejection(row.mean_sec) is None

    ranked = [b.row for b in db.lookup(key, dev, k=4)] + db.best(key, dev, k=4)
    ranked += [r for _, r, _ in db.best_per_workload(dev)] + [r for _, r in db.successful_records(dev)]
    assert ranked and all(usable(r) for r in ranked)
    assert all(r.mean_sec >= 2e-5 or r.point != "honest" for r in ranked)
    assert all(record_rejection(r.record_json) is None for _, _, r in db.training_records(dev))
    for point, sec, error in measured_results(db, key, dev):
        # (a success without a time, NaN by SQL, is told as no time: ok is "error is None and sec")
        assert error is not None or sec is None or floor.rejection(sec) is None, (point, sec)
    (history,) = task_histories(db, dev, -1, [key]).values()
    assert history.best_sec is not None and floor.rejection(history.best_sec) is None
    adapter = MetaScheduleDatabase(db, dev, read_only=True)
    got = adapter.get_top_k(Workload(mod), 4)
    assert got and all("pragma_import" not in str(r.trace) for r in got)
    adapter.get_all_tuning_records()
    load_dataset(db, cpu_device)
    db.close()
