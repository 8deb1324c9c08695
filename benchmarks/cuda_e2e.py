"""A whole model compiled here for a GPU, run on a GPU machine that has only TVM's runtime,
against PyTorch eager and ``torch.compile`` on the same GPU.

Two steps, on two machines:

    # here (TVM's compiler, nvcc; no GPU): the artifact (library and metadata, as `tune -o`
    # writes it), the input, and the output of this model's CPU build on that input
    python benchmarks/cuda_e2e.py export --model resnet50 --db tuned.db --out build/cuda_e2e
    # on the GPU (TVM runtime + PyTorch + torchvision, no compiler)
    python benchmarks/cuda_e2e.py run --dir build/cuda_e2e

``run`` loads the artifact as ``nightshift run`` does (``tuner.artifact.load_artifact``, with
``TVM_USE_RUNTIME_LIB=1``), checks its output against the CPU build's (same weights, same
input: a GPU build that computes something else fails here), and times it against
torchvision's network of the same architecture in PyTorch (its own random weights: dense fp32
latency does not depend on the values), eager and ``torch.compile``, fp32 with TF32 off (what
TVM computes) and with PyTorch's defaults beside. The artifact holds the weights (ResNet-50:
about 100 MB), more than one device call carries (64 MiB), so ``export`` writes it in parts
of ``--part-mib`` that ``run`` joins: send them in calls close together, while the machine is
warm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# torchvision constructors of the zoo's architectures (the zoo follows torchvision's graphs).
TORCHVISION = {"resnet50": "resnet50", "resnet18": "resnet18", "mobilenet_v2": "mobilenet_v2"}


def export(model: str, db: str, out: Path, arch: str, part_mib: int) -> int:
    """Compile ``model`` for CUDA ``arch`` from ``db``; write the artifact in parts, the input
    and the CPU build's output."""
    from tuner.artifact import write_artifact
    from tuner.compile import compile_model, run_model
    from tuner.db import TuningDatabase
    from tuner.device import parse_device
    from tuner.frontends import load_model

    spec = load_model(model)
    database = TuningDatabase(db, create=True)
    out.mkdir(parents=True, exist_ok=True)
    gpu = parse_device("cuda:0", target_arch=arch)
    start = time.perf_counter()
    compiled = compile_model(spec, gpu, database)
    print(f"{model} for {arch}: compiled in {time.perf_counter() - start:.0f} s")
    library = out / f"{model}_{arch}.so"
    # Not checked or timed here (no GPU): `run` does both there.
    write_artifact(library, compiled, spec, gpu, latency_s=None, verification=None, source=model)
    x = spec.random_inputs()
    np.save(out / "input.npy", x[0])
    cpu = parse_device("cpu")
    outputs, latency = run_model(compile_model(spec, cpu, database), cpu, x, budget_s=1.0)
    np.save(out / "expected.npy", outputs[0])
    print(f"CPU build's output ({latency * 1e3:.0f} ms a run) written as the reference")
    data = library.read_bytes()
    library.unlink()
    size = part_mib << 20
    parts = [f"{library.name}.part{i}" for i in range(0, (len(data) + size - 1) // size)]
    for i, name in enumerate(parts):
        (out / name).write_bytes(data[i * size:(i + 1) * size])
    manifest = {"model": model, "arch": arch, "library": library.name, "parts": parts, "bytes": len(data)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{library.name}: {len(data) / 2**20:.1f} MiB in {len(parts)} parts")
    return 0


def run(folder: Path, parts_from: list[Path], json_out: Path, repeat: int) -> int:
    """On the GPU: join the artifact, check its output, time it and PyTorch."""
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    import torch
    import torchvision

    from tuner.artifact import load_artifact, scaled_error
    from tuner.cuda_runtime import gpu_identity, load_cuda_runtime

    meta = json.loads((folder / "manifest.json").read_text())
    library = folder / meta["library"]
    with open(library, "wb") as f:
        for name in meta["parts"]:
            f.write(next(d / name for d in [folder, *parts_from] if (d / name).exists()).read_bytes())
    assert library.stat().st_size == meta["bytes"], "a part is missing or short"
    assert load_cuda_runtime(), "TVM's CUDA runtime library does not load"
    art = load_artifact(library)
    x = np.load(folder / "input.npy")
    expected = np.load(folder / "expected.npy")
    got = art.run([x])[0]
    error = scaled_error([expected], [got])
    samples = art.time([x], repeat)
    row = {"tvm": {"median_s": statistics.median(samples), "scaled_error_vs_cpu_build": error,
                   "operators": art.metadata["operators"]}}  # fmt: skip
    print(json.dumps(row))

    net = getattr(torchvision.models, TORCHVISION[meta["model"]])().cuda().eval()
    xt = torch.from_numpy(x).cuda()
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        suffix = "_tf32" if tf32 else ""
        with torch.no_grad():
            row[f"torch_eager{suffix}_s"] = _time(lambda: net(xt), repeat)
            start = time.perf_counter()
            compiled = torch.compile(net)
            compiled(xt)
            row[f"torch_compile{suffix}_compile_s"] = time.perf_counter() - start
            row[f"torch_compile{suffix}_s"] = _time(lambda c=compiled: c(xt), repeat)
        torch._dynamo.reset()
        print(json.dumps(row))
    result = {"gpu": gpu_identity(0), "torch": torch.__version__, "torchvision": torchvision.__version__,
              "model": meta["model"], "arch": meta["arch"], "repeat": repeat, **row,
              "tvm_over_torch_eager": row["tvm"]["median_s"] / row["torch_eager_s"],
              "tvm_over_torch_compile": row["tvm"]["median_s"] / row["torch_compile_s"]}  # fmt: skip
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0 if error < 1e-3 else 1


def _time(fn, repeat: int) -> float:
    """Median wall time of ``repeat`` synchronized calls, after warm-ups (as ``Artifact.time``)."""
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("--model", default="resnet50", choices=sorted(TORCHVISION))
    ex.add_argument("--db", required=True, help="tuning database (an empty one gives the untuned build)")
    ex.add_argument("--arch", default="sm_90")
    ex.add_argument("--out", type=Path, default=ROOT / "build" / "cuda_e2e")
    ex.add_argument("--part-mib", type=int, default=36)
    rn = sub.add_parser("run")
    rn.add_argument("--dir", type=Path, default=ROOT / "build" / "cuda_e2e")
    rn.add_argument("--parts-from", type=Path, nargs="*", default=[], help="other folders holding parts")
    rn.add_argument("--repeat", type=int, default=100)
    rn.add_argument("--json", type=Path, default=RESULTS / "cuda_e2e.json")
    args = parser.parse_args()
    if args.cmd == "export":
        return export(args.model, args.db, args.out, args.arch, args.part_mib)
    return run(args.dir, args.parts_from, args.json, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
