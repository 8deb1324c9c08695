"""Which cold timing ranks schedules as the model runs them: the data warm, flushed, or as a producer left it?

A cold repeat flushes the weights and the output from the caches. TVM's own flush
(``cache_flush_cpu_non_first_arg``, MetaSchedule's ``enable_cpu_cache_flush``) keeps the first
argument, the data, warm: every core holds it from the previous call. Inside a model the data
was just written by the producer's threads, part of it in each core's cache. For the
``--tasks`` heaviest tuned tasks of ``--model`` in ``--db``, the ``--top`` best records are
built and timed four ways, interleaved, on the job's thread count:

- ``data warm``: TVM's flush, as ``tune --timing cold`` times;
- ``all flushed``: every argument flushed (TVM's flush called with a placeholder first);
- ``producer``: the other arguments flushed, then the data rewritten by one thread per core
  from a copy, each thread its own contiguous part, as a parallel producer leaves it;
- ``rows producer`` / ``channels producer``: the other arguments flushed, then the data
  rewritten from a copy by a TVM kernel on the pool's threads, parallel over its rows (axis 2
  of an NCHW or NCHWc tensor) or its channel blocks (axis 1): a producer whose threads split
  their work by pixels or by channels (``x86-conv2d-nchwc-dot``'s ``split``). Split by pixels,
  a conv after a producer split by rows finds each thread's rows in its own core's cache;
  split by channels, each thread reads the rows the other core wrote either way;
- ``TLB cold``: every argument flushed, then one read from each page of a 256 MiB region
  (65,536 pages; a Zen 3's second-level data TLB holds 2,048), as the model's other
  operators leave the translations of this one's weights. TVM's flush translates every page
  it flushes, so a flushed repeat finds the translations cached, which a model's call does
  not. The region is never written: its pages all map the kernel's zero page, so the reads
  evict translations, not data.

Per task: each record's four medians, which record each way picks, what each pick costs
in the ``--judge`` timing (``producer`` by default), and the stored best timed each way.
Writes benchmarks/archive/results/cold_input.json (``--out``).

    .venv/bin/python benchmarks/archive/cold_input.py --db tuned.db --model resnet50 --precision bf16 --tasks 10 --top 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from rich.console import Console
from rich.table import Table
from tvm import te

from search_spaces import lowering
from search_spaces.preload import preload_tensor_intrinsics
from search_spaces.template_space import TemplateSpace
from search_spaces.templates import x86_conv2d_nchwc_dot as dot_template
from tuner.measure.verify import arg_specs
from tuner.measure.runner import random_args

console = Console()
RESULTS = Path(__file__).parent / "results" / "cold_input.json"
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from flush_ranking import scheduled  # noqa: E402
from parallel_split import knob_values  # noqa: E402
from result_file import write_result  # noqa: E402
from tuned_tasks import tuned_tasks  # noqa: E402

FLUSH = "cache_flush_cpu_non_first_arg"
FLUSH_ALL = "nightshift_bench.flush_all_args"
PRODUCER = "nightshift_bench.producer_wrote_data"
TLB_COLD = "nightshift_bench.tlb_cold"
ROWS = "nightshift_bench.rows_producer"
CHANNELS = "nightshift_bench.channels_producer"
MODES = {
    "data warm": FLUSH,
    "all flushed": FLUSH_ALL,
    "producer": PRODUCER,
    "rows producer": ROWS,
    "channels producer": CHANNELS,
    "TLB cold": TLB_COLD,
}
PAGE = 4096


def register_flush_all() -> None:
    """:data:`FLUSH_ALL`: TVM's flush of every argument but the first, given a placeholder first."""
    flush = tvm.get_global_func(FLUSH)
    placeholder = tvm.runtime.tensor(np.zeros(1, "float32"))
    tvm_ffi.register_global_func(FLUSH_ALL, lambda *args: flush(placeholder, *args), override=True)


def register_tlb_cold(pages: int = 65536) -> None:
    """:data:`TLB_COLD`: every argument flushed, then one read per page of an unwritten region."""
    flush = tvm.get_global_func(FLUSH)
    placeholder = tvm.runtime.tensor(np.zeros(1, "float32"))
    region = np.zeros(pages * PAGE // 8, np.int64)  # calloc'd: untouched pages read as the zero page
    per_page = region[:: PAGE // 8]

    def tlb_cold(*args) -> None:
        flush(placeholder, *args)
        per_page.sum()

    tvm_ffi.register_global_func(TLB_COLD, tlb_cold, override=True)


class Producer:
    """The ``producer`` preprocessing: TVM's flush, then the data rewritten by ``threads``
    threads from :attr:`source` (numpy's copy releases the GIL, so they run at once)."""

    def __init__(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(threads)
        self.threads = threads
        self.source = np.zeros(0, np.uint8)
        self.flush = tvm.get_global_func(FLUSH)
        tvm_ffi.register_global_func(PRODUCER, self, override=True)

    def __call__(self, *args) -> None:
        self.flush(*args)
        data = np.from_dlpack(args[0]._create_view((self.source.size,), "uint8"))
        # Bounds by arithmetic: anything allocated here would evict the data it times.
        step = -(-self.source.size // self.threads)
        parts = [slice(i, i + step) for i in range(0, self.source.size, step)]
        list(self.pool.map(lambda part: np.copyto(data[part], self.source[part]), parts))


class PoolProducer:
    """The ``rows producer`` / ``channels producer`` preprocessing: TVM's flush, then the data
    copied from :attr:`source` by a kernel parallel over ``axis`` on TVM's own thread pool,
    so that each pool thread writes the part that thread would compute in a kernel split the
    same way."""

    def __init__(self, name: str, axis: int, target: tvm.target.Target) -> None:
        self.axis, self.target = axis, target
        self.flush = tvm.get_global_func(FLUSH)
        self.kernels: dict[tuple[tuple[int, ...], str], tvm.runtime.Module] = {}
        self.source: tvm.runtime.Tensor | None = None
        self.copy = None
        tvm_ffi.register_global_func(name, self, override=True)

    def prepare(self, data: tvm.runtime.Tensor) -> None:
        """Copy ``data`` as the source and build (once per shape) the kernel that writes it."""
        shape, dtype = tuple(int(d) for d in data.shape), str(data.dtype)
        if (shape, dtype) not in self.kernels:
            self.kernels[shape, dtype] = copy_kernel(shape, dtype, min(self.axis, len(shape) - 1), self.target)
        self.copy = self.kernels[shape, dtype]["main"]
        self.source = tvm.runtime.tensor(data.numpy())

    def __call__(self, *args) -> None:
        self.flush(*args)
        self.copy(self.source, args[0])


class Splits:
    """The ``split`` knob of a task's ``x86-conv2d-nchwc-dot`` points (0: by channels, 1: by
    pixels; None for other points), its space built once."""

    def __init__(self, task, target: tvm.target.Target) -> None:
        self.task, self.target = task, target
        self.space: TemplateSpace | None = None

    def __call__(self, point_json: str) -> int | None:
        point = json.loads(point_json)
        if point.get("kind") != dot_template.NAME:
            return None
        if self.space is None:
            self.space = TemplateSpace(self.task.mod, self.target, dot_template.NAME)
        return knob_values(self.space, point["decisions"])["split"]


def with_each_split(task, rows: list, tuned, split_of: Splits, depth: int = 200) -> list:
    """``rows`` and, where missing, the task's fastest record of each ``split`` among its ``depth`` best."""
    have = {split_of(r.point) for r in rows}
    out = list(rows)
    for row in tuned.db.best(task.workload_key, tuned.device_id, k=depth):
        split = split_of(row.point)
        if split is not None and split not in have:
            have.add(split)
            out.append(row)
    return out


def copy_kernel(shape: tuple[int, ...], dtype: str, axis: int, target: tvm.target.Target) -> tvm.runtime.Module:
    """A copy of a ``shape`` tensor, its ``axis`` outermost and parallel."""
    src = te.placeholder(shape, dtype, "src")
    out = te.compute(shape, lambda *i: src[i], name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([src, out]))
    loops = sch.get_loops(sch.get_sblock("out"))
    order = [loops[axis], *(loop for k, loop in enumerate(loops) if k != axis)]
    sch.reorder(*order)
    sch.parallel(order[0])
    return tvm.compile(sch.mod, target=target).mod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    p.add_argument("--tasks", type=int, default=10, help="heaviest tuned tasks (weight x best)")
    p.add_argument("--top", type=int, default=6, help="best records per task")
    p.add_argument("--repeat", type=int, default=15, help="cold single-call runs per record and way")
    p.add_argument("--judge", default="producer", choices=list(MODES), help="the way that times every way's pick")
    p.add_argument("--each-split", action="store_true",
                   help="add each task's best record of each split (by channels, by pixels) to its --top")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="the ways to time")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    modes = {m: MODES[m] for m in args.modes}
    if args.judge not in modes:
        p.error(f"--judge {args.judge} is not among --modes")
    # tuned_tasks advises numpy off huge pages first: on huge pages the TLB-cold region's reads would evict few
    # translations
    tuned_all = tuned_tasks(args.db, args.model, top=args.top, precision=args.precision)
    device, rows = tuned_all.device, tuned_all.rows
    threads = int(device.target.attrs.get("num-cores", os.cpu_count() or 1))
    preload_tensor_intrinsics()
    lowering.install()  # records are built as the job built them
    register_flush_all()
    register_tlb_cold()
    producer = Producer(threads)
    pool_producers = [PoolProducer(name, axis, device.target) for mode, name, axis in
                      (("rows producer", ROWS, 2), ("channels producer", CHANNELS, 1)) if mode in modes]  # fmt: skip
    tuned = tuned_all.tasks
    load_before = os.getloadavg()
    out = []
    for task in tuned[: args.tasks]:
        arrays = [tvm.runtime.tensor(a) for a in random_args(arg_specs(task.mod))]
        data = arrays[0]
        nbytes = data.numpy().nbytes
        producer.source = np.from_dlpack(data._create_view((nbytes,), "uint8")).copy()
        for pool_producer in pool_producers:
            pool_producer.prepare(data)
        records = []
        split_of = Splits(task, device.target)
        for row in with_each_split(task, rows[task.workload_key], tuned_all, split_of) if args.each_split \
                else rows[task.workload_key]:
            lib = tvm.compile(scheduled(task, row), target=device.target).mod
            times: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(3):  # interleaved: the ways share the machine's state
                for mode, preproc in modes.items():
                    f = lib.time_evaluator("main", tvm.cpu(), number=1, repeat=max(1, args.repeat // 3),
                                           f_preproc=preproc)  # fmt: skip
                    times[mode] += [float(s) for s in f(*arrays).results]
            records.append({"record_id": row.id, "stored_ms": 1e3 * row.mean_sec, "timing": row.timing,
                            "split": split_of(row.point),
                            **{m: 1e3 * statistics.median(v) for m, v in times.items()}})  # fmt: skip
            last = records[-1]
            console.print(f"  record {row.id} (split {last['split']}): stored {last['stored_ms']:.3f} ms, "
                          + ", ".join(f"{m} {last[m]:.3f}" for m in modes))  # fmt: skip
        picks = {m: min(range(len(records)), key=lambda i, m=m: records[i][m]) for m in modes}
        picks["stored"] = 0
        entry = {"task": task.name, "workload_key": task.workload_key, "weight": task.weight,
                 "data_kb": nbytes / 1e3, "records": records, "picks": picks,
                 "judged_ms_of_pick": {m: records[i][args.judge] for m, i in picks.items()}}  # fmt: skip
        out.append(entry)
        console.print(f"{task.name} (x{task.weight}, data {nbytes / 1e3:.0f} KB): {args.judge} ms of each pick "
                      + ", ".join(f"{m} {v:.3f}" for m, v in entry["judged_ms_of_pick"].items()))  # fmt: skip
    ways = ("stored", *modes)
    table = Table(title=f"{args.model} {args.precision}: each timing's pick, timed {args.judge}")
    base = next(iter(modes))
    best = Table(title=f"the stored best, timed each way (x its {base} time)")
    for t, cols in ((table, ways), (best, modes)):
        for col in ("task", "calls", "data KB", *cols):
            t.add_column(col, justify="left" if col == "task" else "right")
    for e in out:
        head = (e["task"], str(e["weight"]), f"{e['data_kb']:.0f}")
        table.add_row(*head, *(f"{e['judged_ms_of_pick'][m]:.3f}" for m in ways))
        stored = e["records"][0]
        best.add_row(*head, *(f"{stored[m]:.3f} ({stored[m] / stored[base]:.2f})" for m in modes))
    console.print(table)
    console.print(best)
    totals = {m: sum(e["weight"] * e["judged_ms_of_pick"][m] for e in out) for m in ways}
    stored_totals = {m: sum(e["weight"] * e["records"][0][m] for e in out) for m in modes}
    console.print(f"per inference, these tasks with each way's picks ({args.judge} timing): "
                  + ", ".join(f"{m} {v:.3f} ms" for m, v in totals.items()))  # fmt: skip
    console.print("per inference, the stored bests timed each way: "
                  + ", ".join(f"{m} {v:.3f} ms" for m, v in stored_totals.items()))  # fmt: skip
    write_result(args.out, "cold_input", {
        "machine": {"cpu": device.description.get("model", platform.processor()), "target": str(device.target),
                    "threads": threads, "load_before": load_before, "load_after": os.getloadavg()},
        "model": args.model, "precision": args.precision, "db": args.db, "tasks": out,
        "judge": args.judge, "model_ms_by_pick": totals, "model_ms_of_stored_by_way": stored_totals,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
