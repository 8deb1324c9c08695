"""`tune --model resnet50 --device cuda:0` for real on a GPU server, then the tuned build checked
against the CPU build and timed against PyTorch eager and ``torch.compile``: one prepared script.

    python benchmarks/cuda_tune.py --check                       # the GPU side's environment, in seconds
    python benchmarks/cuda_tune.py --time-budget 2m --total 420  # the whole run (device call 3 of the plan)
    python benchmarks/cuda_tune.py --steps bench                 # rerun the last step on the same work dir
    python benchmarks/cuda_tune.py --device cpu --model tiny --time-budget 1m   # the rehearsal here

Steps, each a child process with its own timeout and log (``--work``), the result JSON
rewritten after each one, so a run cut short still leaves what it measured:

1. ``env``: what the GPU side has (nvidia-smi, torch.cuda, nvcc, NVRTC, TVM's CUDA runtime,
   the GPUs Ray counts, the kit's packages); a fatal gap ends the run here (``--check`` runs
   only this step and prints what is wrong).
2. ``reference``: TVM's llvm build of the same model (its seeded weights, every operator on the
   fallback schedule) run on a seeded input: the output the tuned GPU build must give. On a
   GPU it runs beside ``tune``, niced (the GPU timings do not share the CPU's cores).
3. ``tune``: the real command line, ``python -m tuner.cli tune --model M --device D
   --time-budget B --no-verify`` (a local Ray cluster: builds on every core with nvcc, timing
   on the GPU's actor, the XGBoost model and the evolutionary search). Trials and minutes come
   from its ``--log-json`` events.
4. ``compile``: ``tuner.api.compile_model`` from the job's database: the artifact.
5. ``bench``: the artifact's output against the reference, then the artifact, PyTorch eager
   and ``torch.compile`` (the zoo's PyTorch twin holding the same weights) in interleaved
   rounds, each run host inputs in and host outputs out (``tuner.app.run.time_runs``). fp32
   with TF32 off, and on a GPU each peer at PyTorch's defaults (cuDNN convolutions in TF32)
   beside. Ratio = tuned / peer, lower is better.

Writes ``benchmarks/results/cuda_tune_<gpu>.json`` (``cuda_tune_cpu_<mcpu>[_<model>].json`` for
the rehearsal), or ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEPS = ("env", "reference", "tune", "compile", "bench")
# Seconds each step may take beyond the tuning budget, on the GPU server (16 cores); the CPU
# rehearsal on 2 shared cores passes --step-scale.
STEP_TIMEOUT_S = {"env": 90.0, "reference": 300.0, "tune": 180.0, "compile": 240.0, "bench": 240.0}
# What --total keeps for the steps after tune (their usual time there, not their timeout):
# tune is cut to leave them this much.
STEP_RESERVE_S = {"compile": 90.0, "bench": 90.0}
# Packages `tune` imports beyond a PyTorch machine's (the kit's), by import name.
KIT_MODULES = ("tvm", "tvm_ffi", "ray", "xgboost", "optuna", "sqlalchemy", "alembic", "rich", "psutil",
               "cloudpickle")  # fmt: skip
# tvm_ffi imports torch in every process and, for a torch without its C DLPack exchange API
# (2.11 has none), JIT-builds an add-on with torch's C++ extension, once per cold cache, in
# every Ray worker at once. Nightshift passes no torch tensor to TVM.
CHILD_ENV = {"TVM_FFI_DISABLE_TORCH_C_DLPACK": "1", "PYTHONUNBUFFERED": "1"}


# ----- the orchestrator -----


def orchestrate(args: argparse.Namespace) -> int:
    """Run the steps in order, each a child process; write the result after each."""
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.total if args.total else None
    out_path: Path | None = args.out
    result: dict[str, Any] = {}
    kept = work / "result.json"  # the run's copy: --out may lie in a folder emptied between device calls
    if args.steps != list(STEPS) and kept.exists():
        result = json.loads(kept.read_text())  # a rerun of some steps adds to the run's figures
        if out_path is None and (work / "result_path").exists():
            out_path = Path((work / "result_path").read_text().strip())
    result.update(benchmark="cuda_tune", model=args.model, device=args.device, time_budget=args.time_budget,
                  date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  command=shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]), work=str(work))  # fmt: skip
    result.setdefault("steps", {})
    # A shared host's load explains a CPU rehearsal's figures (2 cores at load 8 time nothing).
    result["load_avg_start"] = os.getloadavg()

    def save() -> None:
        text = json.dumps(result, indent=1, default=str) + "\n"
        for path in (kept, out_path):
            if path is None:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)  # a reader (or a kill) never sees half a file
        if out_path is not None:
            (work / "result_path").write_text(str(out_path))

    def budget(step: str) -> float:
        nominal = STEP_TIMEOUT_S[step] * args.step_scale + (_seconds(args.time_budget) if step == "tune" else 0.0)
        if deadline is None:
            return nominal
        later = sum(STEP_RESERVE_S[s] * args.step_scale for s in STEP_RESERVE_S
                    if s in args.steps and STEPS.index(s) > STEPS.index(step))  # fmt: skip
        return max(min(nominal, deadline - time.monotonic() - later), 10.0)

    background: _Child | None = None
    ok = True
    for step in args.steps:
        if step == "reference" and args.device != "cpu" and "tune" in args.steps:
            # Beside tune, niced: it needs one core for a minute, the GPU timings none.
            background = _Child.start(step, args, work, budget(step), nice=10)
            continue
        if step == "bench" and background is not None:
            _record(result, background.wait(), work)
            background = None
            save()
        if step == "compile" and not (work / "tune.db").exists() and args.db is None:
            result["steps"][step] = {"skipped": "no tuning database (the tune step did not run)"}
            save()
            continue
        child = _Child.start(step, args, work, budget(step))
        print(f"[cuda_tune] {step}: started (timeout {child.timeout:.0f} s)", flush=True)
        outcome = child.wait()
        _record(result, outcome, work)
        if out_path is None and step == "env":
            out_path = default_out(args, result)
        save()
        print(f"[cuda_tune] {step}: rc {outcome['rc']} in {outcome['duration_s']:.0f} s"
              + (" (timed out)" if outcome["timed_out"] else ""), flush=True)  # fmt: skip
        if step == "env" and result.get("env", {}).get("fatal"):
            print("[cuda_tune] the environment cannot run the job:\n  " + "\n  ".join(result["env"]["fatal"]))
            ok = False
            break
        if outcome["rc"] != 0 and step in ("compile", "bench"):
            ok = False
    if background is not None:
        _record(result, background.wait(), work)
    result["minutes_total"] = round((time.monotonic() - started) / 60, 2)
    result["load_avg_end"] = os.getloadavg()
    if out_path is None:
        out_path = default_out(args, result)
    save()
    print(json.dumps({k: result.get(k) for k in ("gpu", "trials", "tuning_minutes", "max_error_vs_cpu_build",
                                                  "ratio_vs_pytorch_eager", "ratio_vs_torch_compile",
                                                  "ratio_vs_pytorch_eager_default", "ratio_vs_torch_compile_default",
                                                  "minutes_total")}, indent=1))  # fmt: skip
    print(f"[cuda_tune] wrote {out_path}")
    return 0 if ok and result.get("verified", False) else 1


class _Child:
    """One step's process: its own session (a timeout ends it and what it started), its log."""

    def __init__(self, step: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
        self.step, self.proc, self.log, self.timeout = step, proc, log, timeout
        self.start_time = time.monotonic()

    @classmethod
    def start(cls, step: str, args: argparse.Namespace, work: Path, timeout: float, nice: int = 0) -> _Child:
        env = os.environ | CHILD_ENV
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        cmd = step_command(step, args, work)
        log = work / f"{step}.log"
        (work / f"{step}.json").unlink(missing_ok=True)
        with log.open("wb") as f:
            f.write((shlex.join(cmd) + "\n").encode())
            f.flush()
            niced = (lambda: os.nice(nice)) if nice else None
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True, preexec_fn=niced)  # fmt: skip
        return cls(step, proc, log, timeout)

    def wait(self) -> dict[str, Any]:
        """Wait up to the timeout; then SIGINT (tune saves and stops Ray), SIGKILL 30 s later."""
        timed_out = False
        try:
            rc = self.proc.wait(timeout=max(self.timeout - (time.monotonic() - self.start_time), 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = _stop(self.proc)
        return {"step": self.step, "rc": rc, "timed_out": timed_out, "log": self.log,
                "duration_s": round(time.monotonic() - self.start_time, 1)}  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> int:
    for sig, grace in ((signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return -9


def _record(result: dict[str, Any], outcome: dict[str, Any], work: Path) -> None:
    """Merge a finished step's figures (its JSON) and its log's tail into the result."""
    step, log = outcome["step"], outcome["log"]
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    entry = {k: outcome[k] for k in ("rc", "timed_out", "duration_s")} | {"log_file": str(log),
                                                                           "log_tail": lines[-30:]}  # fmt: skip
    data_file = work / f"{step}.json"
    data = json.loads(data_file.read_text()) if data_file.exists() else {}
    if step == "tune":
        data = tune_figures(work / "events.jsonl") | data
    result["steps"][step] = entry
    if step == "env":
        result["env"] = data
        for key in ("gpu", "gpu_identity", "torch", "tvm", "ray", "cpu"):
            if key in data:
                result[key] = data[key]
    else:
        result.update(data)


def tune_figures(events: Path) -> dict[str, Any]:
    """Trials, minutes and where the time went, from ``tune --log-json``'s events (the last
    ``job_end``, else the last batch: a job cut short still says how far it got)."""
    if not events.exists():
        return {"trials": 0, "tuning_state": "never started"}
    end: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    tasks: set[Any] = set()
    device_s = build_s = wait_s = 0.0
    batches = 0
    for line in events.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        if ev.get("event") == "job_end":
            end = ev
        elif ev.get("event") == "batch_done":
            last, batches = ev, batches + 1
            tasks.add(ev.get("task"))
            device_s += float(ev.get("device_s") or 0.0)
            build_s += float(ev.get("build_s") or 0.0)
            wait_s += float(ev.get("wait_s") or 0.0)
    src = end or last
    if src is None:
        return {"trials": 0}
    elapsed = float(src.get("elapsed_s") or 0.0)
    figures: dict[str, Any] = {
        "trials": int(src.get("trials_done") or 0), "tuning_minutes": round(elapsed / 60, 2),
        "tuning_state": (end or {}).get("state", "cut short"), "tuning_reason": (end or {}).get("reason"),
        "tuning_errors": (end or {}).get("errors"), "batches": batches, "tasks_tuned": len(tasks),
        # Device busy / wall: near 1, the GPU sets the pace; near 0, building or proposing does.
        "device_busy_s": round(device_s, 1), "build_cpu_s": round(build_s, 1), "waited_for_results_s": round(wait_s, 1),
    }  # fmt: skip
    if elapsed > 0:
        figures["trials_per_minute"] = round(figures["trials"] / (elapsed / 60), 1)
    return figures


def default_out(args: argparse.Namespace, result: dict[str, Any]) -> Path:
    """``cuda_tune_<gpu>.json`` (``h200`` from 'NVIDIA H200'); ``cuda_tune_cpu_<mcpu>`` for a CPU."""
    if args.device == "cpu":
        name = "cpu_" + _slug(str((result.get("cpu") or {}).get("mcpu") or "host"))
    else:
        gpu = re.sub(r"(?i)^nvidia\s+", "", str(result.get("gpu") or "gpu")).split()
        name = _slug(gpu[0] if gpu else "gpu")
    suffix = "" if args.model == "resnet50" else f"_{_slug(args.model)}"
    return RESULTS / f"cuda_tune_{name}{suffix}.json"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "x"


def _seconds(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise SystemExit(f"--time-budget: a duration like 240s, 4m or 1h, got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def step_command(step: str, args: argparse.Namespace, work: Path) -> list[str]:
    """The child's command line: the real ``tune`` CLI for the tuning step, this script's
    ``--step`` mode for the others."""
    if step == "tune":
        return [sys.executable, "-m", "tuner.cli", "tune", "--model", args.model, "--device", args.device,
                "--time-budget", args.time_budget, "--db", str(args.db or work / "tune.db"),
                "--job", "cuda_tune", "--no-verify", "-q", "--log-json", str(work / "events.jsonl"),
                *shlex.split(args.tune_args)]  # fmt: skip
    return [sys.executable, str(Path(__file__).resolve()), "--step", step, "--work", str(work),
            "--model", args.model, "--device", args.device, "--rounds", str(args.rounds),
            "--tolerance", str(args.tolerance), "--peers", args.peers,
            *(["--db", str(args.db)] if args.db else [])]  # fmt: skip


# ----- the steps (child processes) -----


def step_env(args: argparse.Namespace) -> dict[str, Any]:
    """What this machine has for the job; ``fatal`` lists what stops it, ``warnings`` the rest."""
    checks: list[dict[str, Any]] = []
    data: dict[str, Any] = {"checks": checks}
    gpu = args.device != "cpu"

    def check(name: str, fn: Callable[[], str], *, fatal: bool = True) -> bool:
        start = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as err:  # every failure is the answer to report, not a crash
            detail, ok = f"{type(err).__name__}: {err}".strip(), False
        checks.append({"check": name, "ok": ok, "detail": detail, "fatal": fatal and not ok,
                       "s": round(time.perf_counter() - start, 2)})  # fmt: skip
        return ok

    data["cpu_cores"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().split("\n")[0]
        data["mem_total"] = mem.split(":")[1].strip()
    data["disk_free_gib"] = round(shutil.disk_usage(args.work).free / 2**30, 1)
    data["python"] = sys.version.split()[0]
    names = ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "TVM_FFI_DISABLE_TORCH_C_DLPACK", "PYTHONPATH", "RAY_ADDRESS")
    data["env_vars"] = {k: os.environ.get(k) for k in names}
    missing = [m for m in KIT_MODULES if importlib.util.find_spec(m) is None]
    check("kit packages", lambda: "all of " + ", ".join(KIT_MODULES) if not missing else _raise(
        f"not importable: {', '.join(missing)} (is the kit installed and its target on PYTHONPATH?)"))

    if gpu:
        def smi() -> str:
            exe = shutil.which("nvidia-smi")
            if exe is None:
                raise RuntimeError("nvidia-smi not on PATH (no driver in this container?)")
            out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout.strip()  # fmt: skip
            data["nvidia_smi"] = out.splitlines()
            return out
        check("nvidia-smi", smi, fatal=False)

    def torch_check() -> str:
        import torch

        data["torch"] = torch.__version__
        if not gpu:
            return torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no GPU (torch.version.cuda={torch.version.cuda})")
        data["torch_gpu"] = torch.cuda.get_device_name(0)
        count = torch.cuda.device_count()
        return f"{torch.__version__}, CUDA {torch.version.cuda}, {count} GPU(s): {data['torch_gpu']}"
    check("torch" + (".cuda" if gpu else ""), torch_check)

    def tvm_check() -> str:
        import tvm
        import tvm_ffi

        data["tvm"] = tvm.__version__
        info = tvm.support.libinfo()
        return (f"tvm {tvm.__version__} (LLVM {info.get('USE_LLVM')}, CUDA {info.get('USE_CUDA')}), "
                f"tvm_ffi {tvm_ffi.__version__}")
    tvm_ok = check("TVM", tvm_check)
    if gpu:
        # The compiler checks need no TVM: they run before the kit is in place too.
        def compiler() -> str:
            from tuner.measure.cuda import cuda_compiler, find_nvcc

            nvcc = find_nvcc()
            used = cuda_compiler()
            if nvcc is None:
                return f"no nvcc (PATH, $CUDA_HOME, /usr/local/cuda, the nvidia-cuda-nvcc wheel): builds use {used}"
            version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=20).stdout
            return f"{nvcc}: {version.strip().splitlines()[-1] if version.strip() else '?'}; builds use {used}"
        check("CUDA compiler", compiler)

        def nvrtc() -> str:
            from cuda.bindings import nvrtc as rtc

            _err, major, minor = rtc.nvrtcVersion()
            return f"NVRTC {major}.{minor} (the fallback where nvcc is missing)"
        check("NVRTC", nvrtc, fatal=False)
        if not tvm_ok:
            data["fatal"] = [f"{c['check']}: {c['detail']}" for c in checks if c["fatal"]]
            data["warnings"] = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"] and not c["fatal"]]
            return data

        def runtime() -> str:
            from tuner.cuda_runtime import driver_present, gpu_identity, load_cuda_runtime

            if not driver_present():
                raise RuntimeError("no NVIDIA driver: libcuda.so.1 does not load")
            if not load_cuda_runtime():
                raise RuntimeError("TVM's CUDA runtime library does not load (libcudart.so.13 missing? driver?)")
            ident = gpu_identity(0)
            if ident is None:
                raise RuntimeError("TVM's CUDA runtime sees no GPU 0")
            data["gpu_identity"], data["gpu"] = ident, ident["gpu"]
            return (f"{ident['gpu']} {ident['arch']}, driver {ident.get('driver')}, "
                    f"CUDA runtime {ident.get('cuda_runtime')}")
        check("TVM CUDA runtime", runtime)

        def ray_gpus() -> str:
            import ray
            from ray._private.accelerators import get_accelerator_manager_for_resource

            manager = get_accelerator_manager_for_resource("GPU")
            count = manager.get_current_node_num_accelerators()
            data["ray"] = ray.__version__
            data["ray_gpus_detected"] = count
            if not count:
                # Nightshift's local cluster offers the GPUs TVM sees (tuner.measure.ray_measure.connect).
                return (f"Ray {ray.__version__} detects 0 GPUs itself (NVML); CUDA_VISIBLE_DEVICES="
                        f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}; Nightshift passes num_gpus from TVM's count")
            return f"Ray {ray.__version__} detects {count} GPU(s)"
        check("Ray GPUs", ray_gpus, fatal=False)
    else:
        def cpu() -> str:
            from tuner.device import parse_device

            dev = parse_device("cpu")
            data["cpu"] = {"model": dev.description.get("model"), "mcpu": dev.target_config.get("mcpu"),
                           "cores": dev.target_config.get("num-cores")}  # fmt: skip
            return f"{data['cpu']}"
        check("CPU target", cpu)
        if importlib.util.find_spec("ray") is not None:
            import ray

            data["ray"] = ray.__version__
    data["fatal"] = [f"{c['check']}: {c['detail']}" for c in checks if c["fatal"]]
    data["warnings"] = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"] and not c["fatal"]]
    return data


def _raise(message: str) -> str:
    raise RuntimeError(message)


def step_reference(args: argparse.Namespace) -> dict[str, Any]:
    """The CPU build's output on a seeded input (every operator on the fallback schedule)."""
    import numpy as np

    from tuner.compile import compile_model, run_model
    from tuner.db import TuningDatabase
    from tuner.device import parse_device
    from tuner.frontends import load_model

    spec = load_model(args.model)
    inputs = spec.random_inputs(seed=0)
    cpu = parse_device("cpu")
    empty = TuningDatabase(str(args.work / "empty.db"), create=True)
    start = time.perf_counter()
    compiled = compile_model(spec, cpu, empty)
    compile_s = time.perf_counter() - start
    outputs, latency = run_model(compiled, cpu, inputs, budget_s=0.5)
    np.savez(args.work / "reference.npz", **{f"input{i}": x for i, x in enumerate(inputs)},
             **{f"output{i}": y for i, y in enumerate(outputs)})  # fmt: skip
    return {"reference": {"what": "TVM llvm build, fallback schedules, same seeded weights",
                          "target": str(cpu.target), "compile_s": round(compile_s, 1),
                          "latency_ms": round(latency * 1e3, 3)}}  # fmt: skip


def step_compile(args: argparse.Namespace) -> dict[str, Any]:
    """The artifact from the job's database (``tuner.api.compile_model``)."""
    from tuner.api import compile_model

    r = compile_model(args.model, output=artifact_path(args), device=args.device, db=args.db or args.work / "tune.db",
                      verify="off", progress=False)  # fmt: skip
    return {"artifact": str(r.artifact), "operators": r.operators, "compile_s": round(r.compile_s, 1)}


def artifact_path(args: argparse.Namespace) -> Path:
    return args.work / f"{_slug(args.model)}_{_slug(args.device)}.so"


class _TorchRunner:
    """The zoo's PyTorch twin, one run = host inputs in, host outputs out (as TVM's)."""

    def __init__(self, fn: Any, device: str, label: str, tf32: tuple[bool, bool] | None) -> None:
        import torch

        self.torch, self.fn, self.device, self.label, self.tf32 = torch, fn, device, label, tf32
        self.precision = "tf32" if tf32 and any(tf32) else "f32"

    def run(self, inputs: list[Any]) -> list[Any]:
        torch = self.torch
        if self.tf32 is not None:  # (matmul, cuDNN); process-wide flags: set for each run of each runner
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.tf32
        with torch.inference_mode():
            out = self.fn(*(torch.from_numpy(x).to(self.device) for x in inputs))
        outs = out if isinstance(out, (list, tuple)) else [out]
        return [t.cpu().numpy() for t in outs]


class _TvmRunner:
    def __init__(self, art: Any) -> None:
        self.art, self.label, self.precision = art, "TVM tuned", "f32"

    def run(self, inputs: list[Any]) -> list[Any]:
        return self.art.run(inputs)


def step_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Check the artifact against the CPU build, then time it against PyTorch in rounds."""
    import numpy as np

    from tuner.api import load
    from tuner.app.run import WARMUP_S, LatencyStats
    from tuner.artifact import scaled_error
    from tuner.bench import interleave

    out: dict[str, Any] = {}
    if args.device != "cpu":
        from tuner.cuda_runtime import gpu_identity, load_cuda_runtime

        if not load_cuda_runtime():  # without it TVM sees no GPU and the artifact does not load
            raise RuntimeError("TVM's CUDA runtime library does not load")
        out["gpu_identity"] = gpu_identity(0)
    art = load(artifact_path(args))
    ref_file = args.work / "reference.npz"
    if ref_file.exists():
        ref = np.load(ref_file)
        inputs = [ref[f"input{i}"] for i in range(len(art.inputs))]
        expected = [ref[k] for k in sorted((k for k in ref.files if k.startswith("output")), key=lambda k: int(k[6:]))]
    else:
        from tuner.api import random_inputs

        inputs, expected = random_inputs(art), None
    got = art.run(inputs)
    if expected is not None:
        out["max_error_vs_cpu_build"] = scaled_error(expected, got)
        out["verified"] = bool(out["max_error_vs_cpu_build"] <= args.tolerance)
        out["tolerance"] = args.tolerance
    print(f"tuned build vs CPU build: {out.get('max_error_vs_cpu_build')}", flush=True)

    import torch

    from tuner.frontends import load_model
    from tuner.peers.torch_zoo import torch_zoo_model

    gpu = args.device != "cpu"
    dev = args.device if gpu else "cpu"
    if not gpu:
        torch.set_num_threads(int(art.metadata.get("device", {}).get("threads") or os.cpu_count() or 1))
    defaults = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}  # fmt: skip
    out["torch"] = torch.__version__
    out["torch_tf32_defaults"] = defaults
    net = torch_zoo_model(load_model(args.model)).to(dev)
    runners: dict[str, Any] = {"tvm": _TvmRunner(art)}
    # TF32 off: fp32 as TVM computes it. On a GPU, PyTorch's defaults beside (cuDNN convs in TF32).
    off = (False, False)
    default = (defaults["cuda.matmul.allow_tf32"], defaults["cudnn.allow_tf32"])
    variants = [(off, "")] + ([(default, "_default")] if gpu else [])
    peers = set(args.peers.split(","))
    for tf32, suffix in variants:
        flag = tf32 if gpu else None
        if "eager" in peers:
            runners[f"torch_eager{suffix}"] = _TorchRunner(net, dev, f"PyTorch eager{suffix}", flag)
        if "compile" in peers:
            runners[f"torch_compile{suffix}"] = _TorchRunner(torch.compile(net), dev, f"torch.compile{suffix}", flag)
    errors: dict[str, float] = {}
    first_s: dict[str, float] = {}
    for key, runner in list(runners.items()):
        start = time.perf_counter()
        try:
            result = runner.run(inputs)
        except Exception as err:  # a peer that cannot run is reported, the others go on
            out.setdefault("peer_failures", {})[key] = f"{type(err).__name__}: {err}"[:2000]
            del runners[key]
            continue
        first_s[key] = round(time.perf_counter() - start, 2)  # torch.compile's compile time
        if expected is not None:
            errors[key] = scaled_error(expected, result)
        print(f"{key}: first run {first_s[key]} s, error vs CPU build {errors.get(key)}", flush=True)
    out["first_run_s"], out["error_vs_cpu_build"] = first_s, errors
    samples, _order = interleave(runners, inputs, rounds=args.rounds, warmup=1, settle_s=0.0 if gpu else 0.1,
                                 warmup_s=WARMUP_S)  # fmt: skip
    stats = {k: LatencyStats.of(v) for k, v in samples.items() if v}
    out["latency"] = {k: s.to_json() for k, s in stats.items()}
    out["rounds"] = args.rounds
    tvm = stats["tvm"].median_ms
    for peer, name in (("torch_eager", "pytorch_eager"), ("torch_compile", "torch_compile")):
        for suffix in ("", "_default"):
            if f"{peer}{suffix}" in stats:
                out[f"ratio_vs_{name}{suffix}"] = round(tvm / stats[f"{peer}{suffix}"].median_ms, 4)
    out["ratio"] = "tuned TVM median / peer median, timed in the same interleaved rounds; lower is better"
    return out


STEP_FUNCS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "env": step_env, "reference": step_reference, "compile": step_compile, "bench": step_bench,
}  # fmt: skip


def run_step(args: argparse.Namespace) -> int:
    """Child mode: run one step in this process; its figures to ``<work>/<step>.json``."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("tuner").setLevel(logging.INFO)  # ours; TVM's MetaSchedule INFO lines are noise
    start = time.perf_counter()
    data = STEP_FUNCS[args.step](args)
    data[f"{args.step}_s"] = round(time.perf_counter() - start, 1)
    (args.work / f"{args.step}.json").write_text(json.dumps(data, indent=1, default=str))
    if args.step == "env" and data.get("fatal"):
        return 1
    if args.step == "bench" and not data.get("verified", True):
        return 1
    return 0


def print_check(data: dict[str, Any]) -> None:
    """``--check``'s table: each check, ok or what is wrong."""
    for c in data["checks"]:
        mark = "ok  " if c["ok"] else ("FAIL" if c["fatal"] else "warn")
        print(f"{mark} {c['check']:<18} {c['detail']}  ({c['s']} s)")
    if data["fatal"]:
        print("what is wrong:\n  " + "\n  ".join(data["fatal"]))
    else:
        print("ready" + (f" ({len(data['warnings'])} warning(s))" if data["warnings"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0", help="cuda:0, or cpu for the rehearsal")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--time-budget", default="2m", help="tune's --time-budget (120s, 2m)")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default: results/cuda_tune_<gpu>.json)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/cuda_tune"), help="databases, artifact, logs")
    parser.add_argument("--db", type=Path, default=None, help="tuning database (default: <work>/tune.db)")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS), help="a subset, to rerun")
    parser.add_argument("--total", type=float, default=None,
                        help="seconds the whole run must fit in: the tune step is cut to leave the rest theirs")
    parser.add_argument("--step-scale", type=float, default=1.0, help="multiply the steps' timeouts (slow hosts)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest scaled error against the CPU build")
    parser.add_argument("--tune-args", default="", help="more options for tune, as one string")
    parser.add_argument("--peers", default="eager,compile", help="PyTorch peers: eager, compile or both")
    parser.add_argument("--check", action="store_true", help="check the environment only, say what is wrong")
    parser.add_argument("--step", choices=list(STEP_FUNCS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:  # this checkout's tuner before any installed one (the kit's)
        sys.path.insert(0, str(ROOT))
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.step:
        return run_step(args)
    if args.check:
        os.environ.update(CHILD_ENV)
        data = step_env(args)
        print_check(data)
        return 1 if data["fatal"] else 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
