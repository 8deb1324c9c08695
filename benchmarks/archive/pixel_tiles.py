"""Pixel tiles along the fused (oh, ow) axis against row tiles, on ResNet-50's conv tasks.

``x86-conv2d-nchwc`` tiles ``tile_oh x reg_n`` output pixels with ``reg_n`` dividing the
row (ResNet's rows are 56, 28, 14, 7 wide), or, with ``fuse_pixels``, ``reg_n`` pixels of
the fused (oh, ow) axis. The operators are the tasks ``tune`` extracts (Relax's legalized
conv2d_NCHWc with its fused epilogue, int64 indices), found by shape. For each this script
takes the same grid of both kinds: every register tile of 4 accumulators or more, both reduction
orders with the input-channel block unrolled whole (the window outside or inside it), the
kernel window as a loop or unrolled, the parallel loop over (n, oc) tiles; padding as its
own pass. Each point is built, checked
against the unscheduled operator and then timed in rounds, interleaved with PyTorch's conv
(oneDNN) with the same epilogue on the same inputs and threads, so machine noise hits all of
them alike. Each
point is timed warm (inputs and weights left in cache between runs) and cold (caches flushed
before each run, as ``tune`` times by default and as a model's layers run: ResNet-50's
weights do not fit in cache). Fused tiles that do not divide the pixel count have their
last tile peeled (:mod:`search_spaces.lowering`); with ``--unpeeled`` those points are also
built by TVM's own pipeline, which leaves a bounds check in every tile of these int64 tasks,
and timed in the same rounds. With ``--precision bf16`` the tasks are those of ``tune
--precision bf16``, the template ``x86-conv2d-nchwc-dot`` (vdpbf16ps), and PyTorch's conv
runs in bf16. Writes benchmarks/archive/results/pixel_tiles.json.

    .venv/bin/python benchmarks/archive/pixel_tiles.py --rounds 3
    .venv/bin/python benchmarks/archive/pixel_tiles.py --rounds 3 --precision bf16 --unpeeled
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import tvm
from op_ceiling import build_checked, cpu_threads, time_call

import search_spaces
from search_spaces import Point, lowering
from tuner.measure.verify import arg_specs, reference
from tuner.frontends import load_model
from tuner.graph.layout.plan import vector_lanes
from tuner.precision import check_device
from tuner.graph.tasks import Task, extract_tasks

logger = logging.getLogger("pixel_tiles")
RESULTS = Path(__file__).parent / "results" / "pixel_tiles.json"
MODES = ("warm", "cold")
KINDS = {0: "rows", 1: "fused", 2: "fused_unpeeled"}

# (in channels, input size, out channels, kernel, output size) of ResNet-50 convs.
SHAPES = {
    "3x3_256_14": (256, 14, 256, 3, 14),
    "3x3_128_28": (128, 28, 128, 3, 28),
    "3x3_512_7": (512, 7, 512, 3, 7),
    "1x1_512_2048_7": (512, 7, 2048, 1, 7),
    "1x1_256_1024_14": (256, 14, 1024, 1, 14),
    "1x1s2_1024_2048_14": (1024, 14, 2048, 1, 7),
}


def find_task(tasks: list[Task], shape: tuple[int, int, int, int, int], block: int) -> Task:
    """ResNet-50's conv task of ``shape`` (the first, where several differ in epilogue), by its
    weight's (out, in) blocks and window and its output size, in fp32 or on the dot-product
    instruction (bf16 data comes padded, weights ``OIHW{i/n}i16o{n}i``)."""
    c, _, o, k, out = shape
    for task in tasks:
        shapes = [list(a.shape) for a in arg_specs(task.mod)]
        if ("conv2d_NCHWc" in task.name and shapes[1][:4] == [o // block, c // block, k, k]
                and shapes[0][1] == c // block and shapes[-1][1:3] == [o // block, out]):
            return task
    raise LookupError(f"no conv task of shape {shape}")


def torch_call(task: Task, shape: tuple[int, int, int, int, int], inputs: list[np.ndarray]):
    """PyTorch's conv + bias (+ residual) (+ relu) of ``task`` on the same numbers, in NCHW;
    in bf16 (oneDNN's bf16 kernels) where the task's data is bf16."""
    import torch

    c, hw, o, k, out = shape
    bf16 = str(inputs[0].dtype) == "bfloat16"
    dtype = torch.bfloat16 if bf16 else torch.float32

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a.astype(np.float32))).to(dtype)

    def nchw(a: np.ndarray) -> torch.Tensor:  # NCHW[x]c -> NCHW
        return tensor(a.transpose(0, 1, 4, 2, 3).reshape(1, -1, *a.shape[2:4]))

    x = nchw(inputs[0])
    weight = inputs[1]
    # OIHW{i}i{o}o, or on the instruction OIHW{i/n}i16o{n}i: to OIHW.
    axes = (0, 5, 1, 4, 6, 2, 3) if weight.ndim == 7 else (0, 5, 1, 4, 2, 3)
    w = tensor(weight.transpose(axes).reshape(o, c, k, k))
    bias = tensor(inputs[2].reshape(o))
    residual = [nchw(a) for a in inputs[3:-1]]
    padding = (k - 1) // 2 if x.shape[2] == hw else 0  # bf16 data comes padded
    f = torch.nn.functional

    def call() -> torch.Tensor:
        y = f.conv2d(x, w, bias, stride=hw // out, padding=padding)
        for r in residual:
            y = y + r
        return f.relu(y) if "relu" in task.name else y

    return call


def grid(space: search_spaces.SearchSpace, unpeeled: bool = False, max_fused: int | None = None,
         ) -> dict[int, list[Point]]:  # fmt: skip
    """The benchmark's points of ``space`` by kind (:data:`KINDS`): row tiles, fused tiles
    (``max_fused`` of them drawn at random, seeded, where there are more; row tiles all), and
    with ``unpeeled`` the fused tiles with a partial last tile again (built unpeeled)."""
    knobs = space.knobs(0)
    names = [k.name for k in knobs]
    whole_ic = max(next(k for k in knobs if k.name == "tile_ic").choices)
    out: dict[int, list[Point]] = {0: [], 1: [], 2: []}
    for point in space.enumerate():
        v = dict(zip(names, point.decisions, strict=True))
        if v["tile_ic"] != whole_ic or v.get("pad_inline") or v["parallel_depth"] != 2 or v["order"] == 2:
            continue
        out[v["fuse_pixels"]].append(point)
    if max_fused is not None and len(out[1]) > max_fused:
        drawn = np.random.default_rng(0).choice(len(out[1]), max_fused, replace=False)
        out[1] = [out[1][i] for i in sorted(drawn)]
    if unpeeled:
        for point in out[1]:
            v = dict(zip(names, point.decisions, strict=True))
            if v["out_h"] * v["out_w"] % v["reg_n"]:
                out[2].append(point)
    return {kind: points for kind, points in out.items() if points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: the convs as tune --precision bf16 extracts them, on vdpbf16ps "
                             "(x86-conv2d-nchwc-dot), PyTorch's conv in bf16 beside them")
    parser.add_argument("--max-fused", type=int, default=None,
                        help="time at most this many fused points per shape, drawn at random (default: all)")
    parser.add_argument("--unpeeled", action="store_true",
                        help="also time the fused tiles with a partial last tile as TVM's own pipeline builds them")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    device, threads = cpu_threads()
    target = device.target
    check_device(args.precision, device)
    block = 16 if args.precision == "bf16" else vector_lanes(target)
    kind = "x86-conv2d-nchwc-dot" if args.precision == "bf16" else "x86-conv2d-nchwc"
    report: dict = {
        "benchmark": "pixel_tiles", "date": time.strftime("%Y-%m-%d"), "device": device.description,
        "target": device.target_config, "threads": threads, "block": block, "rounds": args.rounds,
        "tvm": tvm.__version__, "torch": torch.__version__, "precision": args.precision, "template": kind,
        "shapes": [],
        "command": f"pixel_tiles.py --shapes {' '.join(args.shapes)} --rounds {args.rounds}"
                   + (" --unpeeled" if args.unpeeled else "") + f" --precision {args.precision}"
                   + (f" --max-fused {args.max_fused}" if args.max_fused else ""),
    }
    dev = tvm.cpu(0)
    tasks = extract_tasks(load_model("resnet50").bound(), target, precision=args.precision)
    for name in args.shapes:
        task = find_task(tasks, SHAPES[name], block)
        ref = reference(task.mod, target)
        space = search_spaces.create(task.mod, target, kind=kind)
        timers: list[tuple[int, Point, dict[str, object], list]] = []
        failed = 0
        for fused, points in grid(space, args.unpeeled, args.max_fused).items():
            for point in points:
                with lowering.tvm_pipeline() if fused == 2 else contextlib.nullcontext():
                    built = build_checked(space.apply(point).mod, target, ref, dev)
                if built is None:
                    failed += 1
                    continue
                lib, arrays = built
                timers.append((fused, point, {
                    "warm": lib.mod.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=20),
                    "cold": lib.mod.time_evaluator("main", dev, number=1, repeat=5,
                                               f_preproc="cache_flush_cpu_non_first_arg"),
                }, arrays))
        peer = torch_call(task, SHAPES[name], ref.inputs)
        want = ref.outputs[-1].astype(np.float32).transpose(0, 1, 4, 2, 3).reshape(tuple(peer().shape))
        # bf16: PyTorch rounds the conv's output to bf16 (8 bits of mantissa) before the epilogue.
        tol = 3e-2 if args.precision == "bf16" else 1e-3
        if not np.allclose(peer().float().numpy(), want, rtol=tol, atol=tol * np.abs(want).max()):
            raise RuntimeError(f"{task.name}: PyTorch's output differs from TVM's reference")
        secs: dict[str, list[list[float]]] = {mode: [[] for _ in timers] for mode in MODES}
        torch_sec: list[float] = []
        for r in range(args.rounds):
            for n, (_, _, timer, arrays) in enumerate(timers):
                for mode in MODES:
                    secs[mode][n].append(float(np.median(timer[mode](*arrays).results)))
            torch_sec.append(time_call(peer))
            logger.info("%s: round %d/%d of %d points", name, r + 1, args.rounds, len(timers))
        torch_ms = float(np.median(torch_sec)) * 1e3
        entry: dict = {"shape": name, "task": task.name, "flops": task.flops, "wrong": failed,
                       "torch_warm_ms": torch_ms}
        for mode in MODES:
            entry[mode] = {}
            for fused, label in KINDS.items():
                if not any(t[0] == fused for t in timers):
                    continue
                mine = sorted((float(np.median(secs[mode][n])) * 1e3, timers[n][1])
                              for n in range(len(timers)) if timers[n][0] == fused)
                best_ms, best = mine[0]
                entry[mode][label] = {
                    "points": len(mine), "best_ms": best_ms, "median_ms": float(np.median([m for m, _ in mine])),
                    "best_gflops": task.flops / best_ms / 1e6, "best_point": space.values(best),
                }
            entry[mode]["fused_over_rows"] = entry[mode]["fused"]["best_ms"] / entry[mode]["rows"]["best_ms"]
            # The same partial-tile point peeled over unpeeled, point by point.
            ms = {(timers[n][0], timers[n][1].decisions): float(np.median(secs[mode][n])) for n in range(len(timers))}
            pairs = [ms[(1, d)] / ms[(2, d)] for kind, d in ms if kind == 2]
            if pairs:
                entry[mode]["peeled_over_unpeeled_median"] = float(np.median(pairs))
            # PyTorch is timed warm (its weights stay in cache between calls).
            entry[mode]["best_over_torch_warm"] = min(entry[mode][k]["best_ms"] for k in ("rows", "fused")) / torch_ms
        report["shapes"].append(entry)
        logger.info("%s", json.dumps(entry))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
