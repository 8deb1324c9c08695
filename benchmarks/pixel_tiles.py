"""Pixel tiles along the fused (oh, ow) axis against row tiles, per ResNet-50 conv shape.

``x86-conv2d-nchwc`` tiles ``tile_oh x reg_n`` output pixels with ``reg_n`` dividing the
row (ResNet's rows are 56, 28, 14, 7 wide), or, with ``fuse_pixels``, ``reg_n`` pixels of
the fused (oh, ow) axis, the last shorter tile peeled off. For each shape this script takes
the same grid of both kinds: every register tile of 4 accumulators or more, both reduction
orders with the input-channel block unrolled whole (the window outside or inside it), the
kernel window as a loop or unrolled, the parallel loop over (n, oc) tiles; padding as its
own pass. Each point is built, checked
against the unscheduled operator and then timed in rounds, interleaved with PyTorch's conv
(oneDNN) on the same inputs and threads, so machine noise hits all of them alike. Each
point is timed warm (inputs and weights left in cache between runs) and cold (caches flushed
before each run, as ``tune`` times by default and as a model's layers run: ResNet-50's
weights do not fit in cache). Writes benchmarks/results/pixel_tiles.json.

    .venv/bin/python benchmarks/pixel_tiles.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import tvm
from op_ceiling import conv_nchwc, cpu_threads, time_call

import search_spaces
from search_spaces import Point
from search_spaces.verify import compare, reference
from tuner.layout import vector_lanes

logger = logging.getLogger("pixel_tiles")
RESULTS = Path(__file__).parent / "results" / "pixel_tiles.json"
MODES = ("warm", "cold")

# (name, in channels, input size, out channels, kernel, stride, pad): ResNet-50's convs whose
# output rows are 14 or 7 wide, where row tiles are 1, 2, 7 or 14 pixels.
SHAPES = {
    "3x3_256_14": (256, 14, 256, 3, 1, 1),
    "3x3_512_7": (512, 7, 512, 3, 1, 1),
    "1x1_512_2048_7": (512, 7, 2048, 1, 1, 0),
    "1x1_256_1024_14": (256, 14, 1024, 1, 1, 0),
    "3x3s2_256_28": (256, 28, 256, 3, 2, 1),
    "1x1s2_1024_2048_14": (1024, 14, 2048, 1, 2, 0),
}


def grid(space: search_spaces.SearchSpace) -> dict[int, list[Point]]:
    """The benchmark's points of ``space`` by ``fuse_pixels`` (0: row tiles, 1: fused)."""
    knobs = space.knobs(0)
    names = [k.name for k in knobs]
    out: dict[int, list[Point]] = {0: [], 1: []}
    for point in space.enumerate():
        v = dict(zip(names, point.decisions, strict=True))
        if v["tile_ic"] != v["oc_block"] or v["pad_inline"] or v["parallel_depth"] != 2 or v["order"] == 2:
            continue
        out[v["fuse_pixels"]].append(point)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    device, threads = cpu_threads()
    target = device.target
    block = vector_lanes(target)
    report: dict = {
        "benchmark": "pixel_tiles", "date": time.strftime("%Y-%m-%d"), "device": device.description,
        "target": device.target_config, "threads": threads, "block": block, "rounds": args.rounds,
        "tvm": tvm.__version__, "torch": torch.__version__, "shapes": [],
    }
    dev = tvm.cpu(0)
    for name in args.shapes:
        c, hw, o, k, stride, pad = SHAPES[name]
        wl = conv_nchwc(name, c, hw, o, k, stride, pad, block, block)
        ref = reference(wl.mod, target)
        space = search_spaces.create(wl.mod, target, kind="x86-conv2d-nchwc")
        timers: list[tuple[int, Point, dict[str, object], list]] = []
        failed = 0
        for fused, points in grid(space).items():
            for point in points:
                lib = tvm.compile(space.apply(point).mod, target=target)
                arrays = [tvm.runtime.tensor(a, dev) for a in ref.inputs]
                lib["main"](*arrays)
                if compare([a.numpy() for a in arrays], ref.outputs).wrong:
                    failed += 1
                    continue
                timers.append((fused, point, {
                    "warm": lib.mod.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=20),
                    "cold": lib.mod.time_evaluator("main", dev, number=1, repeat=5,
                                               f_preproc="cache_flush_cpu_non_first_arg"),
                }, arrays))
        torch_fn = wl.torch_call(ref.inputs)
        secs: dict[str, list[list[float]]] = {mode: [[] for _ in timers] for mode in MODES}
        torch_sec = []
        for r in range(args.rounds):
            for n, (_, _, timer, arrays) in enumerate(timers):
                for mode in MODES:
                    secs[mode][n].append(float(np.median(timer[mode](*arrays).results)))
            torch_sec.append(time_call(torch_fn))
            logger.info("%s: round %d/%d of %d points", name, r + 1, args.rounds, len(timers))
        torch_ms = float(np.median(torch_sec)) * 1e3
        entry: dict = {"shape": name, "flops": wl.flops, "wrong": failed, "torch_warm_ms": torch_ms}
        for mode in MODES:
            entry[mode] = {}
            for fused, label in ((0, "rows"), (1, "fused")):
                mine = sorted((float(np.median(secs[mode][n])) * 1e3, timers[n][1])
                              for n in range(len(timers)) if timers[n][0] == fused)
                best_ms, best = mine[0]
                entry[mode][label] = {
                    "points": len(mine), "best_ms": best_ms, "median_ms": float(np.median([m for m, _ in mine])),
                    "best_gflops": wl.flops / best_ms / 1e6, "best_point": space.values(best),
                }
            entry[mode]["fused_over_rows"] = entry[mode]["fused"]["best_ms"] / entry[mode]["rows"]["best_ms"]
        entry["warm"]["best_over_torch"] = min(entry["warm"][k]["best_ms"] for k in ("rows", "fused")) / torch_ms
        report["shapes"].append(entry)
        logger.info("%s", json.dumps(entry))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
