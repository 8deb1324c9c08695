"""The task scheduler's allocation of trials.

The latencies here are synthetic curves of best latency against trials: they stand in for
measurements because these tests are about how the scheduler divides a budget between
tasks, not about any schedule's speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import tvm
from tvm import te

from tuner.graph.tasks import Task
from tuner.search.scheduler import MIN_FIRST_BATCH, NoTaskAvailable, TaskScheduler, op_kind

Curve = Callable[[int], float | None]


@pytest.fixture(scope="module")
def mod() -> tvm.IRModule:
    """A real (tiny) PrimFunc module; the scheduler reads only names, weights and FLOPs."""
    a = te.placeholder((8,), name="a")
    b = te.compute((8,), lambda i: a[i] + 1, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def power_law(latency: float, gain: float, scale: float = 50.0) -> Curve:
    """Best latency after t trials: starts at ``latency``, ``gain`` of it can be won, slowly."""
    return lambda t: latency * (1 - gain + gain * (1 + t / scale) ** -0.5)


def plateau(latency: float, until: int) -> Curve:
    """Improves steeply for ``until`` trials, then never again."""
    return lambda t: latency * (0.5 + 0.5 * math.exp(-min(t, until) / 20))


def failing(_t: int) -> None:
    """Every candidate fails: no latency."""
    return None


def run(sched: TaskScheduler, curves: list[Curve], budget: int, batch: int = 16) -> list[int]:
    """Drive ``sched`` as a job does; return the order in which tasks were chosen."""
    order, used = [], 0
    while used < budget and not sched.all_done:
        i = sched.next_task()
        n = sched.first_batch_size(i, batch)
        sched.update(i, n, curves[i](sched.trials[i] + n))
        order.append(i)
        used += n
    return order


def tasks_of(mod: tvm.IRModule, *specs: tuple[str, int, float]) -> list[Task]:
    return [Task(name, mod, weight, flops, f"key{k}") for k, (name, weight, flops) in enumerate(specs)]


def test_op_kind():
    assert op_kind("fused_conv2d15_subtract7_divide7_multiply7_add13_relu7") == "conv2d"
    assert op_kind("fused_conv2d_add_relu") == "conv2d"
    assert op_kind("fused_matmul_add22") == "matmul"
    assert op_kind("reshape3") == "reshape"


@pytest.mark.parametrize(("weights", "latencies"), [((4, 1), (0.01, 0.01)), ((1, 1), (0.04, 0.01))],
                         ids=["weight", "latency"])  # fmt: skip
def test_more_trials_where_weight_times_latency_is_larger(mod, weights, latencies):
    tasks = tasks_of(mod, ("fused_conv2d_add", weights[0], 1e9), ("fused_conv2d1_add1", weights[1], 1e9))
    sched = TaskScheduler(tasks, epsilon=0.0)
    run(sched, [power_law(lat, 0.6) for lat in latencies], budget=512)
    assert sum(sched.trials) == 512
    assert sched.trials[0] >= 2 * sched.trials[1], sched.trials
    assert sched.trials[1] >= 16  # the first round still gave it a batch


def test_steeper_improvement_wins_at_equal_weight_times_latency(mod):
    """Two tasks with the same weight, trials and best latency: the one still improving goes next."""
    tasks = tasks_of(mod, ("fused_matmul_add", 1, 1e9), ("fused_conv2d_add", 1, 1e9))
    sched = TaskScheduler(tasks, epsilon=0.0)
    histories = [[0.0101, 0.01006, 0.01003, 0.0100], [0.0200, 0.0150, 0.0120, 0.0100]]
    for step in range(4):
        for i, hist in enumerate(histories):
            sched.update(i, 16, hist[step])
    assert sched.best_sec == [0.01, 0.01] and sched.trials == [64, 64]
    assert sched.gradient(1) < sched.gradient(0) < 0
    assert sched.next_task() == 1
    # Without the backward term (alpha 0) nothing separates them but the index.
    flat = TaskScheduler(tasks, epsilon=0.0, alpha=0.0)
    for step in range(4):
        for i, hist in enumerate(histories):
            flat.update(i, 16, hist[step])
    assert flat.gradient(0) == flat.gradient(1)


def test_task_far_below_similar_tasks_gets_more(mod):
    """Forward estimate: a conv at a tenth of its peer's GFLOPS has more to win than a matmul."""
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9), ("fused_conv2d1_add1", 1, 1e8),
                     ("fused_matmul_add", 1, 1e8))  # fmt: skip
    # conv2d: 100 GFLOPS; conv2d1 and matmul both at 0.01 s = 10 GFLOPS, both flat.
    curves = [power_law(0.01, 0.05), power_law(0.01, 0.05), power_law(0.01, 0.05)]
    sched = TaskScheduler(tasks, epsilon=0.0, patience=10**6)
    run(sched, curves, budget=256)
    assert sched.trials[1] >= 2 * sched.trials[2], sched.trials


def test_task_that_only_fails_is_capped(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9), ("fused_conv2d1_add1", 1, 2e9), ("fused_dense_add", 1, 1e9))
    sched = TaskScheduler(tasks, epsilon=0.0, max_failed_trials=48)
    run(sched, [power_law(0.01, 0.6), failing, power_law(0.01, 0.6)], budget=1024)
    assert sched.trials[1] == 48
    assert sched.is_done(1) and not sched.is_done(0)
    assert "no success" in (sched.done_reason(1) or "")
    assert sched.best_sec[1] is None
    assert sum(sched.trials) == 1024


def test_failures_after_a_success_do_not_kill(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9))
    sched = TaskScheduler(tasks, max_failed_trials=16, patience=10**6)
    sched.update(0, 16, 0.01)
    for _ in range(10):
        sched.update(0, 16, None)
    assert not sched.is_done(0)
    assert sched.best_sec == [0.01]


def test_converged_tasks_stop(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9), ("fused_conv2d1_add1", 1, 1e9))
    sched = TaskScheduler(tasks, epsilon=0.0, patience=64)
    order = run(sched, [plateau(0.02, 64), plateau(0.01, 400)], budget=4096)
    # Task 0 stopped improving at 64 trials: it is done within `patience` (+ one batch) more.
    assert sched.is_done(0) and "converged" in (sched.done_reason(0) or "")
    assert 64 + 64 <= sched.trials[0] <= 64 + 64 + 16
    last0 = max(k for k, i in enumerate(order) if i == 0)
    assert all(i == 1 for i in order[last0 + 1 :]) and len(order) > last0 + 1
    # Then task 1 converged too: the job stops before spending the budget.
    assert sched.all_done and sum(sched.trials) < 4096
    with pytest.raises(NoTaskAvailable):
        sched.next_task()


def test_noise_below_min_improvement_is_not_progress(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9))
    sched = TaskScheduler(tasks, patience=64, min_improvement=0.01)
    sched.update(0, 16, 0.01)
    for k in range(4):
        sched.update(0, 16, 0.01 * (1 - 0.001 * (k + 1)))  # 0.1% gains: noise
    assert sched.is_done(0)
    assert sched.best_sec[0] == pytest.approx(0.01 * 0.996)


def test_tiny_tasks_get_small_first_batches(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add_relu", 3, 2.3e8), ("fused_matmul_add", 1, 4e6),
                     ("max_pool2d", 1, 8e5), ("reshape", 1, 0.0))  # fmt: skip
    sched = TaskScheduler(tasks, tiny_first_batch=4)
    assert [sched.first_batch_size(i, 32) for i in range(4)] == [32, 32, 4, 4]
    assert sched.first_batch_size(2, 2) == 2
    first_round = [sched.next_task() for _ in range(1)]
    run(sched, [power_law(0.01, 0.5)] * 4, budget=32 + 32 + 4 + 4, batch=32)
    assert first_round == [0]
    assert sched.trials == [32, 32, 4, 4]
    # After its first batch a tiny task is sized like any other (the gradient keeps it rare).
    assert sched.first_batch_size(2, 32) == 32


def test_a_small_trial_cap_is_spread_over_every_first_batch(mod):
    """A cap below the first round's demand shrinks each first batch in proportion, so tiny
    tasks and layout probes keep their smaller share and every task is measured once."""
    tasks = tasks_of(mod, *[(f"fused_conv2d{k}_add_relu", 1, 2e8) for k in range(4)], ("max_pool2d", 1, 8e5),
                     ("reshape", 1, 0.0))  # fmt: skip
    sched = TaskScheduler(tasks, tiny_first_batch=4)
    assert [sched.first_batch_size(i, 16, 1000) for i in range(6)] == [16, 16, 16, 16, 4, 4]
    demand = 4 * 16 + 2 * 4
    assert [sched.first_batch_size(i, 16, 40) for i in range(6)] == [16 * 40 // demand] * 4 + [2, 2]
    # Task 0's batch is out and taken from what is left: the others share the rest.
    assert sched.first_batch_size(1, 16, 40 - 8, in_flight={0}) == 16 * 32 // (demand - 16)
    sizes, left = [], 40
    for i in range(6):
        sizes.append(sched.first_batch_size(i, 16, left))
        sched.update(i, sizes[-1], 1e-3)
        left -= sizes[-1]
    assert left >= 0 and min(sizes) >= 2, sizes
    assert sched.first_batch_size(0, 16, 0) == 16  # measured: full batches from now on


def test_a_trial_cap_sizes_first_batches_by_the_square_root_of_each_tasks_share(mod):
    """Two heavy convs and twenty light ones under a 128-trial cap. Spread evenly (the rule
    without a budget), the first round would take 110 trials at 5 a task; by square-root
    shares the heavy convs keep their full batch, each light conv gets 3, and what is left
    goes to the heavy convs' second batches by the gradient rule."""
    specs = [(f"fused_conv2d{k}_add", 1, 1e9) for k in range(2)] + [(f"fused_conv2d{k}_add", 1, 1.5e7)
                                                                    for k in range(2, 22)]  # fmt: skip
    tasks = tasks_of(mod, *specs)
    even = TaskScheduler(tasks)
    assert {even.first_batch_size(i, 16, 128) for i in range(22)} == {16 * 128 // (22 * 16)}
    sched = TaskScheduler(tasks, epsilon=0.0, patience=10**6, budget=128)
    assert [sched.first_batch_size(i, 16, 128) for i in (0, 1, 2, 21)] == [16, 16, 3, 3]
    curves = [power_law(0.01, 0.5)] * 2 + [power_law(1.5e-4, 0.5)] * 20
    run(sched, curves, budget=128)
    assert all(sched.trials[2:]) and max(sched.trials[2:]) == 3, sched.trials
    assert sum(sched.trials[:2]) >= 128 - 20 * 3 and min(sched.trials[:2]) > 16, sched.trials


def test_a_trial_cap_the_first_round_fits_leaves_it_as_it_was(mod):
    tasks = tasks_of(mod, *[(f"fused_conv2d{k}_add_relu", 1, 2e8) for k in range(4)], ("max_pool2d", 1, 8e5),
                     ("reshape", 1, 0.0))  # fmt: skip
    free, capped = TaskScheduler(tasks, tiny_first_batch=4), TaskScheduler(tasks, tiny_first_batch=4, budget=72)
    assert [capped.first_batch_size(i, 16, 72) for i in range(6)] == [free.first_batch_size(i, 16) for i in range(6)]
    # One trial short of the first round's demand, the shares apply: a 64-byte reshape gets the least.
    short = TaskScheduler(tasks, tiny_first_batch=4, budget=71)
    assert short.first_batch_size(5, 16, 71) == MIN_FIRST_BATCH < free.first_batch_size(5, 16)


def test_a_memory_bound_task_is_weighed_by_the_bytes_it_moves(mod):
    """A reshape does no FLOPs but moves 8 MB: under a short cap it gets more than the
    minimum first batch; the same reshape of 64 bytes gets the minimum."""
    a = te.placeholder((1 << 20,), name="a")
    big = tvm.IRModule({"main": te.create_prim_func([a, te.compute((1 << 20,), lambda i: a[i], name="b")])})
    tasks = [*tasks_of(mod, *[(f"fused_conv2d{k}_add", 1, 1e9) for k in range(8)]),
             Task("reshape", big, 1, 0.0, "big"), Task("reshape1", mod, 1, 0.0, "small")]  # fmt: skip
    sched = TaskScheduler(tasks, budget=96)
    assert sched.first_batch_size(9, 16, 96) == MIN_FIRST_BATCH
    assert MIN_FIRST_BATCH < sched.first_batch_size(8, 16, 96) <= sched.tiny_first_batch


def test_first_round_in_order_skipping_excluded(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9), ("fused_conv2d1_add", 1, 1e9), ("fused_dense", 1, 1e9))
    sched = TaskScheduler(tasks)
    assert sched.next_task() == 0
    assert sched.next_task(exclude={0}) == 1  # task 0's first batch is in flight
    assert sched.next_task(exclude={0, 1}) == 2
    with pytest.raises(NoTaskAvailable):
        sched.next_task(exclude={0, 1, 2})


def test_retired_task_is_never_chosen(mod):
    tasks = tasks_of(mod, ("fused_conv2d_add", 1, 1e9), ("fused_dense", 1, 1e9))
    sched = TaskScheduler(tasks, epsilon=1.0)
    sched.retire(0, "space exhausted")
    assert {sched.next_task() for _ in range(50)} == {1}
    assert sched.done_reason(0) == "space exhausted"


def test_epsilon_explores_and_the_seed_repeats(mod):
    tasks = tasks_of(mod, *[(f"fused_conv2d{k}_add", 1, 1e9) for k in range(4)])
    curves = [power_law(0.001 * 4**k, 0.5) for k in range(4)]

    def allocate(epsilon: float, seed: int) -> tuple[list[int], list[int]]:
        sched = TaskScheduler(tasks, epsilon=epsilon, seed=seed, patience=10**6)
        return run(sched, curves, budget=1024), sched.trials

    assert allocate(0.5, 7) == allocate(0.5, 7)
    assert allocate(0.5, 7)[0] != allocate(0.5, 8)[0]
    greedy, explore = allocate(0.0, 7)[1], allocate(1.0, 7)[1]
    # Greedy leaves the lightest task at its first batch; choosing at random does not.
    assert greedy[0] == 16 and explore[0] > 64, (greedy, explore)


def test_rejects_bad_parameters(mod):
    with pytest.raises(ValueError, match="alpha"):
        TaskScheduler(tasks_of(mod, ("a", 1, 1.0)), alpha=1.5)
    with pytest.raises(ValueError, match="beta"):
        TaskScheduler(tasks_of(mod, ("a", 1, 1.0)), beta=0.5)


def test_round_robin_gives_the_next_batch_to_the_least_trialled_task(mod):
    """``round-robin`` (the ablation's baseline): after the same first round, the live task with
    the fewest trials, ties by index, whatever the weights; the gradient rule, on the same
    tasks, gives most of the budget to the heavy one."""
    tasks = tasks_of(mod, ("fused_conv2d_add", 8, 1e9), ("fused_conv2d1_add1", 1, 1e9),
                     ("fused_dense_add", 1, 1e9), ("fused_max_pool2d", 1, 1e3))  # fmt: skip
    curves = [power_law(0.01, 0.6), power_law(0.01, 0.6), power_law(0.01, 0.6), power_law(1e-6, 0.1)]
    rr = TaskScheduler(tasks, mode="round-robin", patience=10**6)
    order = run(rr, curves, budget=52 + 4 * 16 * 3)
    # The first round as in gradient mode (the pooling task's small first batch included), then
    # the pooling task, which has the fewest trials, and every task in turn by index.
    assert order == [0, 1, 2, 3] + [3, 0, 1, 2] * 3, order
    assert rr.trials == [64, 64, 64, 52], rr.trials
    rr.retire(2, "space exhausted")
    assert rr.next_task() == 3 and rr.next_task(exclude={3}) == 0  # live tasks only, ties by index
    gradient = TaskScheduler(tasks, epsilon=0.0, patience=10**6)
    run(gradient, curves, budget=52 + 4 * 16 * 3)
    assert gradient.trials[0] > 2 * max(gradient.trials[1:]), gradient.trials


def test_an_unknown_scheduler_names_the_choices(mod):
    from tuner.errors import UserInputError
    from tuner.job import TuneConfig

    with pytest.raises(ValueError, match="mode must be one of gradient, round-robin, got 'fifo'"):
        TaskScheduler(tasks_of(mod, ("a", 1, 1.0)), mode="fifo")
    with pytest.raises(UserInputError, match="--scheduler must be one of gradient, round-robin, got 'fifo'"):
        TuneConfig(trials=4, scheduler="fifo")
    assert TuneConfig(trials=4).scheduler == "gradient"
    assert TaskScheduler(tasks_of(mod, ("a", 1, 1.0))).mode == "gradient"


def layout_variants(mod: tvm.IRModule, convs: int, *, io_bytes: int = 0) -> list[Task]:
    """``convs`` convs, each a blocked task (rank 0) and an NCHW one (rank 1): alternatives."""
    tasks = []
    for c in range(convs):
        for rank, name in enumerate((f"fused_conv2d_NCHWc{c}_add", f"fused_conv2d{c}_add")):
            tasks.append(Task(name, mod, 1, 1e9, f"key{c}-{rank}", "NCHW8c" if rank == 0 else "NCHW",
                              choice=f"conv{c}", choice_rank=rank, io_bytes=io_bytes))  # fmt: skip
    return tasks


def test_a_clearly_losing_layout_stops_getting_trials(mod):
    """Conv 0's NCHW variant runs 3x slower than its blocked one at any trial count: after its
    probe it gets (almost) nothing, while conv 1's NCHW variant, the faster one, is tuned."""
    tasks = layout_variants(mod, 2)
    curves = [power_law(0.01, 0.5), power_law(0.03, 0.5),  # conv 0: blocked wins by 3x
              power_law(0.01, 0.5), power_law(0.009, 0.5)]  # conv 1: NCHW a little faster  # fmt: skip
    sched = TaskScheduler(tasks, epsilon=0.0, patience=10**6)
    order = run(sched, curves, budget=640)
    assert order[:4] == [0, 2, 1, 3]  # the preferred layout first, then the probes
    assert sched.first_batch_size(0, 16) == 16  # already measured: full batches from now on
    assert sched.trials[1] <= 8 + 16, sched.trials  # its probe, at most one batch more
    assert sched.trials[0] >= 8 * sched.trials[1], sched.trials
    assert sched.trials[3] >= 8 * sched.trials[1], sched.trials
    # Not a split in halves: the budget went where the model's latency is decided.
    assert sched.trials[0] + sched.trials[3] >= 0.75 * 640, sched.trials


def test_many_convs_in_a_losing_layout_get_their_probe_only(mod):
    """ResNet-50 has 20 convs: Ansor's forward term (latency / trials) promised every young
    NCHW variant more than its 3x margin, and a 2048-trial job gave 40% of its trials to the
    layout it then did not compile. Trailing layouts now get their probe, nothing more."""
    tasks = layout_variants(mod, 20)
    curves = [c for _ in range(20) for c in (power_law(0.01, 0.5), power_law(0.03, 0.5))]
    sched = TaskScheduler(tasks, patience=10**6, seed=3)  # epsilon-greedy on, as in a job
    run(sched, curves, budget=2048)
    losing = sched.trials[1::2]
    assert sum(losing) <= 0.1 * 2048, losing
    assert max(losing) <= 8 + 16, losing


def test_alternatives_enter_the_objective_by_their_best(mod):
    tasks = [*layout_variants(mod, 1), Task("fused_matmul_add", mod, 2, 1e8, "dense")]
    sched = TaskScheduler(tasks, epsilon=0.0)
    assert [sched.first_batch_size(i, 16) for i in range(3)] == [16, 8, 16]  # the NCHW variant probes
    sched.update(0, 16, 0.004)
    assert sched.objective() is None  # the dense task has no time yet
    sched.update(2, 16, 0.001)
    assert sched.objective() == pytest.approx(0.004 + 2 * 0.001)  # the unmeasured alternative is not needed
    sched.update(1, 8, 0.003)
    assert sched.objective() == pytest.approx(0.003 + 2 * 0.001)  # the better of the two, not their sum
    assert sched.preferred_rank() == 1


def test_transforms_count_against_a_layout_the_model_does_not_prefer(mod):
    """Conv 1's NCHW variant is faster alone, but the model prefers the blocked layout (conv 0
    strongly): running conv 1 in NCHW costs two transforms of its input and output, measured
    by the model's layout_transform task (1 MB in 1 ms: 1 GB/s)."""
    a = te.placeholder((1 << 18,), name="a")  # 1 MiB of float32 in, 1 MiB out
    b = te.compute((1 << 18,), lambda i: a[i], name="b")
    transform = Task("te_layout_transform", tvm.IRModule({"main": te.create_prim_func([a, b])}), 1, 0.0, "lt")
    tasks = [*layout_variants(mod, 2, io_bytes=1 << 20), transform]
    sched = TaskScheduler(tasks, epsilon=0.0)
    for i, sec in enumerate((0.010, 0.030, 0.010, 0.009)):
        sched.update(i, 16, sec)
    assert sched.preferred_rank() == 0
    # Before the transform is measured, the default bandwidth (10 GB/s) makes it cheap.
    assert sched.contribution(3) == pytest.approx(0.009 + 2 * (1 << 20) / 10e9)
    sched.update(4, 4, 2 * (1 << 20) / 1e9)
    assert sched.contribution(3) == pytest.approx(0.009 + 2 * (1 << 20) / 1e9)
    assert sched.contribution(2) == pytest.approx(0.010)  # the preferred layout pays nothing
    assert sched.objective() == pytest.approx(0.010 + 0.010 + 2 * (1 << 20) / 1e9)
    # Conv 1's NCHW variant now trails by more than a batch can be expected to win back.
    assert sched.gradient(3) > sched.gradient(2)


def test_a_trailing_layout_behind_its_own_peers_catches_up(mod):
    """Conv 2's blocked variant measures slower than its NCHW one after its first batch, but
    the other blocked convs run 3x faster than it: what its layout reaches elsewhere makes it
    worth more trials, and with them it overtakes NCHW. Judged at half of its peers' GFLOPS
    (``catch_up_share`` 0, the scheduler before) it kept its first batch and the model ran NCHW."""
    tasks = layout_variants(mod, 3)
    curves = [power_law(0.005, 0.3), power_law(0.015, 0.3), power_law(0.005, 0.3), power_law(0.015, 0.3),
              lambda t: 0.005 + 0.0165 * math.exp(-t / 40),  # conv 2, blocked: slow start, fast later
              lambda t: 0.009 + 0.001 * (1 + t / 50) ** -0.5]  # conv 2, NCHW: ahead at first  # fmt: skip

    def conv2_after(share: float) -> TaskScheduler:
        # Every NCHW variant probed in the first round: conv 2's leads from there.
        sched = TaskScheduler(tasks, epsilon=0.0, patience=10**6, catch_up_share=share, layout_probes=3)
        run(sched, curves, budget=640)
        return sched

    before, now = conv2_after(0.0), conv2_after(0.5)
    assert before.trials[4] == 16 and before.contribution(5) < before.contribution(4), before.trials
    assert now.trials[4] >= 48 and now.contribution(4) < now.contribution(5), now.trials
    # The NCHW variants of the convs whose blocked layout leads from the start still get nothing.
    assert max(now.trials[1], now.trials[3]) <= 8 + 16, now.trials


def test_in_model_is_the_leading_alternative_or_a_task_without_any(mod):
    tasks = [*layout_variants(mod, 1), Task("fused_matmul_add", mod, 2, 1e8, "dense")]
    sched = TaskScheduler(tasks, epsilon=0.0)
    assert not any(sched.in_model(i) for i in range(3))  # nothing measured
    sched.update(0, 16, 0.004)
    sched.update(2, 16, 0.001)
    assert [sched.in_model(i) for i in range(3)] == [True, False, True]
    sched.update(1, 8, 0.003)  # the NCHW variant now leads
    assert [sched.in_model(i) for i in range(3)] == [False, True, True]


def test_a_small_cap_probes_a_losing_layout_twice_and_keeps_the_first_round_whole(mod):
    """At 512 trials over 20 convs a ResNeXt-50 job on a Zen 3 spent 172 trials probing NCHW,
    which lost in 23 of 24 convs, and shrank the blocked convs' first batches to pay for it.
    Now a trailing layout's two heaviest convs are probed; the others earn their probe by
    what the layout reached there, which beats no blocked conv."""
    tasks = layout_variants(mod, 20)
    curves = [c for _ in range(20) for c in (power_law(0.01, 0.5), power_law(0.03, 0.5))]
    sched = TaskScheduler(tasks, patience=10**6, epsilon=0.0)
    sizes = [sched.first_batch_size(i, 16, 512) for i in range(0, 40, 2)]
    assert sizes == [16] * 20  # 320 trials: no shrinking for probes that may never come
    run(sched, curves, budget=512)
    assert sum(1 for t in sched.trials[1::2] if t) == 2 and sched.trials[1] == sched.trials[3] == 8, sched.trials
    assert min(sched.trials[0::2]) >= 16


def test_a_layout_that_wins_somewhere_earns_its_probe_there(mod):
    """The probes show NCHW at a quarter of the blocked convs' GFLOPS, but conv 5's blocked
    variant runs at a tenth of theirs (a depthwise-like conv): NCHW could win it, so it is
    probed, and the model runs it in NCHW; the other convs' NCHW variants are never probed."""
    tasks = layout_variants(mod, 6)
    curves = [c for _ in range(5) for c in (power_law(0.01, 0.3), power_law(0.04, 0.3))]
    curves += [power_law(0.1, 0.3), power_law(0.03, 0.3)]
    sched = TaskScheduler(tasks, patience=10**6, epsilon=0.0)
    run(sched, curves, budget=400)
    assert sched.trials[11] > 0 and sched.in_model(11), sched.trials
    assert [sched.trials[i] for i in (5, 7, 9)] == [0, 0, 0], sched.trials
    # Round-robin, the ablation's baseline, still probes every alternative.
    rr = TaskScheduler(tasks, patience=10**6, mode="round-robin")
    run(rr, curves, budget=400)
    assert all(rr.trials[1::2]), rr.trials


def test_a_probe_promises_nothing_before_its_layout_is_measured(mod):
    tasks = layout_variants(mod, 3)
    sched = TaskScheduler(tasks, epsilon=0.0)
    for i in (0, 2, 4):
        sched.update(i, 16, 0.01)
    assert sched.gradient(5) == 0.0  # no NCHW task measured: nothing to estimate it by
    assert sched.next_task(exclude={1}) == 3  # the second of the layout's first-round probes
    sched.update(1, 8, 0.04)
    sched.update(3, 8, 0.04)
    assert sched.gradient(5) == 0.0  # NCHW reached 25 GFLOPS; the blocked conv runs at 100
    with pytest.raises(ValueError, match="layout_probes"):
        TaskScheduler(tasks, layout_probes=0)


def test_a_trailing_plans_own_tasks_wait_until_a_conv_leads_in_it(mod):
    """The NCHW plan's pool (no conv's alternative, in that plan only) gets no first batch while
    every conv runs blocked, and no share of a small cap; once the NCHW variant leads a conv,
    the pool is measured next."""
    tasks = layout_variants(mod, 3)
    tasks += [Task("max_pool2d", mod, 1, 8e5, "pool", plans=(0,)),
              Task("max_pool2d[NCHW]", mod, 1, 8e5, "pool-nchw", choice_rank=1, plans=(1,))]  # fmt: skip
    sched = TaskScheduler(tasks, epsilon=0.0, patience=10**6, tiny_first_batch=4)
    assert [sched.first_batch_size(i, 16, 3 * 16 + 4) for i in (0, 2, 4, 6)] == [16, 16, 16, 4]
    for i in (0, 2, 4, 6):
        assert sched.next_task() == i
        sched.update(i, sched.first_batch_size(i, 16), 0.01)
    assert sched.next_task() == 1  # the layout probes, then no first batch for the NCHW pool
    sched.update(1, 8, 0.04)
    sched.update(3, 8, 0.04)
    assert sched.next_task() != 7 and sched.trials[7] == 0
    sched.update(5, 8, 0.005)  # conv 2 now runs faster in NCHW
    assert sched.next_task() == 7
