"""The contract of every search space kind, on every test task it applies to."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import CASES, space
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm.s_tir import Schedule

from search_spaces import InvalidPointError, Point, SearchSpace, SketchSpace
from tuner.db.validate import trace_rejection
from tuner.search.remote import trace_json

HYPOTHESIS = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))


def _in_domains(sp: SearchSpace, p: Point) -> bool:
    knobs = sp.knobs(p.sketch)
    return len(knobs) == len(p.decisions) and all(v in k.choices for k, v in zip(knobs, p.decisions, strict=True))


def _diff(a: Point, b: Point) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a.decisions, b.decisions, strict=True)) if x != y]


def test_knobs_and_size(case_space):
    sp = case_space
    assert sp.num_sketches >= 1
    grid = 0
    for s in range(sp.num_sketches):
        knobs = sp.knobs(s)
        names = [k.name for k in knobs]
        assert len(set(names)) == len(names), names
        assert all(len(k) == len(set(k.choices)) >= 1 for k in knobs)
        grid += math.prod(len(k) for k in knobs)
    assert sp.grid_size() == grid
    assert 1 <= sp.size() <= grid


def test_sample_is_valid_and_seeded(case_space):
    sp = case_space
    a = [sp.sample(np.random.default_rng(7)) for _ in range(2)]
    assert a[0] == a[1], "same seed, same point"
    rng = np.random.default_rng(0)
    points = [sp.sample(rng) for _ in range(8)]
    for p in points:
        assert _in_domains(sp, p)
        assert sp.check(p) is None
    if sp.size() > 8:
        assert len({p.to_json() for p in points}) > 1


def test_apply_is_deterministic_and_json_round_trips(case_space):
    sp = case_space
    for p in [sp.sample(np.random.default_rng(s)) for s in range(3)]:
        back = Point.from_json(p.to_json())
        assert back == p and back.to_json() == p.to_json()
        sp._cache.clear()  # apply from scratch, not from the cache
        first = sp.apply(p).mod
        assert tvm_ffi.structural_equal(first, sp.apply(back).mod)
        sp._cache.clear()
        assert tvm_ffi.structural_equal(first, sp.apply(back).mod)


def _copies(sch) -> bool:
    try:
        sch.copy()
    except tvm.error.InternalError:
        return False
    return True


def test_a_sampled_point_is_built_once_and_its_schedule_is_the_replayed_one(case_space):
    """``sample`` validates a point by building it; that schedule is the one ``apply`` hands
    out (no second replay), and it is the schedule the point gives built from scratch."""
    sp = case_space
    rng = np.random.default_rng(11)
    for _ in range(3):
        before = sp.built.copy()
        p = sp.sample(rng)
        sch = sp.apply(p)
        sp.check(p)
        # A tensorized schedule cannot be copied in TVM 0.27 (SearchSpace.apply): apply
        # schedules it afresh, once more.
        allowed = 1 if _copies(sp._cached(p)) else 2
        assert sp.built[p.to_json()] - before[p.to_json()] <= allowed, "a sampled point was built twice"
        fresh = sp._schedule(p)
        assert tvm_ffi.structural_equal(sch.mod, fresh.mod)
        assert str(sch.trace) == str(fresh.trace)


def test_apply_returns_a_fresh_schedule(case_space):
    sp = case_space
    p = sp.sample(np.random.default_rng(3))
    before = sp.apply(p).mod
    sch = sp.apply(p)
    sch.annotate(sch.get_child_blocks(sch.get_sblock("root"))[0], "nightshift.test", 1)
    assert tvm_ffi.structural_equal(sp.apply(p).mod, before)


def test_trace_replays_in_tvm(case_space):
    sp = case_space
    p = sp.sample(np.random.default_rng(11))
    trace = sp.to_trace(p)
    sch = Schedule(sp.mod, seed=1)
    trace.apply_to_schedule(sch, remove_postproc=False)
    assert tvm_ffi.structural_equal(sch.mod, sp.apply(p).mod)
    if isinstance(sp, SketchSpace):
        assert sp.from_trace(trace) == p


def test_trace_passes_the_databases_allow_list(case_space):
    """The job stores a candidate whose trace ``tuner.db.validate`` refuses as a failure
    (``refused_trace``) and the compiler never replays it, so a space whose traces it refuses
    measures nothing: ``x86-row-taps``'s first job did, before ``LoopPartition`` was allowed."""
    sp = case_space
    sch = sp.apply(sp.sample(np.random.default_rng(5)))
    assert trace_rejection(trace_json(sch)) is None


@given(seed=st.integers(0, 2**32 - 1))
@settings(HYPOTHESIS)
@pytest.mark.parametrize("case", CASES[:1] + [c for c in CASES if c[0] != "sketch"][:1], ids=lambda c: "-".join(c))
def test_mutate_changes_one_knob_property(case, seed):
    sp = space(*case)
    rng = np.random.default_rng(seed)
    p = sp.sample(rng)
    m = sp.mutate(p, rng)
    assert len(_diff(p, m)) == 1
    assert _in_domains(sp, m) and sp.check(m) is None
    assert Point.from_json(m.to_json()) == m


def test_mutate(case_space):
    sp = case_space
    rng = np.random.default_rng(5)
    p = sp.sample(rng)
    if sp.size() == 1:
        with pytest.raises(RuntimeError):
            sp.mutate(p, rng)
        return
    for _ in range(3):
        m = sp.mutate(p, rng)
        assert m.sketch == p.sketch and len(_diff(p, m)) == 1 and sp.is_valid(m)


def test_neighbours(case_space):
    sp = case_space
    p = sp.sample(np.random.default_rng(2))
    near = sp.neighbours(p)
    assert len({n.to_json() for n in near}) == len(near)
    for n in near:
        d = _diff(p, n)
        assert len(d) == 1 and sp.is_valid(n)
        knob = sp.knobs(p.sketch)[d[0]]
        assert n.decisions[d[0]] in knob.neighbours(p.decisions[d[0]])


def test_invalid_points_are_rejected(case_space):
    sp = case_space
    p = sp.sample(np.random.default_rng(1))
    with pytest.raises(InvalidPointError, match="decisions"):
        sp.apply(Point(p.sketch, p.decisions[:-1]))
    with pytest.raises(InvalidPointError, match="sketch"):
        sp.apply(Point(sp.num_sketches, p.decisions))
    knob = next(i for i, k in enumerate(sp.knobs(p.sketch)) if k.kind != "compute_location")
    bad = list(p.decisions)
    bad[knob] = (999_983,) if isinstance(bad[knob], tuple) else 999_983
    with pytest.raises(InvalidPointError, match="domain"):
        sp.apply(Point(p.sketch, tuple(bad)))
    assert not sp.is_valid(Point(p.sketch, tuple(bad)))


def test_enumerate(case_space):
    sp = case_space
    if sp.grid_size() > 600:
        with pytest.raises(ValueError, match="max_points"):
            next(iter(sp.enumerate(max_points=600)))
        return
    listed = list(sp.enumerate(max_points=600))
    keys = [p.to_json() for p in listed]
    assert len(set(keys)) == len(keys) >= 1
    assert len(listed) <= sp.size()
    assert all(sp.is_valid(p) for p in listed)
    rng = np.random.default_rng(0)
    assert {sp.sample(rng).to_json() for _ in range(5)} <= set(keys)


@pytest.mark.slow
def test_points_apply_identically_in_another_process(tmp_path: Path):
    """Every case's points give the same schedule (structural hash) in a fresh process."""
    wanted = []
    for case in CASES:
        sp = space(*case)
        p = sp.sample(np.random.default_rng(42))
        wanted.append({"case": list(case), "point": p.to_json(),
                       "hash": int(tvm_ffi.structural_hash(sp.apply(p).mod))})
    spec = tmp_path / "points.json"
    spec.write_text(json.dumps(wanted))
    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import tvm_ffi
from conftest import space
from search_spaces import Point
out = []
for item in json.load(open({str(spec)!r})):
    sp = space(*item["case"])
    out.append(int(tvm_ffi.structural_hash(sp.apply(Point.from_json(item["point"])).mod)))
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == [w["hash"] for w in wanted]


def test_trace_survives_tvm_tuning_record_json(case_space):
    """A point stored as a MetaSchedule TuningRecord (what the database keeps, written by
    ``record_as_json`` as TVM's JSON database writes it) replays to the same schedule after a
    JSON round trip, index maps included (the fused pixel tiles' ``transform_layout``)."""
    from tvm.s_tir import meta_schedule as ms

    from tuner.trace_json import record_as_json

    sp = case_space
    p = sp.sample(np.random.default_rng(13))
    workload = ms.database.Workload(sp.mod)
    args = ms.arg_info.ArgInfo.from_prim_func(sp.mod["main"])
    record = ms.database.TuningRecord(sp.to_trace(p), workload, [1e-3], sp.target, args)
    text = json.dumps(record_as_json(record))
    back = ms.database.TuningRecord.from_json(json.loads(text), workload)
    sch = Schedule(sp.mod, seed=1)
    back.trace.apply_to_schedule(sch, remove_postproc=False)
    assert tvm_ffi.structural_equal(sch.mod, sp.apply(p).mod)


@pytest.mark.parametrize(("task_name", "target_name"), [("conv", "llvm"), ("matmul", "cuda-sm90")])
def test_sketch_knobs_do_not_depend_on_the_seed(task_name, target_name):
    from conftest import target, task

    base = space("sketch", task_name, target_name)
    other = SketchSpace(task(task_name), target(target_name), seed=7)
    assert other.num_sketches == base.num_sketches
    assert all(other.knobs(s) == base.knobs(s) for s in range(base.num_sketches))
    p = base.sample(np.random.default_rng(9))
    assert tvm_ffi.structural_equal(other.apply(p).mod, base.apply(p).mod)
