"""What every process registers before it builds a design space (search_spaces.preload)."""

from __future__ import annotations

import tvm
from tvm import te, topi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from search_spaces.preload import POOLING_RULES, preload_tensor_intrinsics


def _spaces(mod: tvm.IRModule, target: tvm.target.Target) -> list[str]:
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", task_name="pool",
                         rand_state=7, num_threads=1)  # fmt: skip
    return [str(design.trace) for design in ctx.space_generator.generate_design_space(mod)]


def test_pooling_spaces_are_meta_schedules_own_without_its_warning(capfd):
    """TOPI's max pool names a schedule rule TVM does not register; MetaSchedule then warns
    and schedules the block as if unannotated. With Nightshift's rules the space is the same
    (the annotation removed, then the ordinary rules) and nothing is printed."""
    preload_tensor_intrinsics()
    x = te.placeholder((1, 4, 28, 28, 16), name="x")
    pooled = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NCHW16c")
    mod = tvm.IRModule({"main": te.create_prim_func([x, pooled])})
    assert '"schedule_rule": "meta_schedule.pool_max"' in mod.script() and "meta_schedule.pool_max" in POOLING_RULES
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    capfd.readouterr()
    got = _spaces(mod, target)
    assert "Unknown schedule rule" not in capfd.readouterr().err
    bare = Schedule(mod)
    bare.unannotate(bare.get_sblock("pool_max"), "schedule_rule")
    want = _spaces(bare.mod, target)
    unannotate = 'sch.unannotate(block_or_loop=b1, ann_key="schedule_rule")\n'
    assert got and all(unannotate in trace for trace in got)
    assert [trace.replace(f"  {unannotate}", "") for trace in got] == want
