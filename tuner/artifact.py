"""The deployable artifact a job ends with: a shared library and a metadata JSON beside it.

The library is the Relax VM executable exported with ``export_library`` (weights are bound
as constants, so there is no separate params file); the metadata says what it is (model,
device fingerprint, inputs, how many operators were tuned, measured latency, how its output
was verified). Loading and running need TVM's runtime alone: this module imports only
``tvm.runtime`` APIs and numpy, and works under ``TVM_USE_RUNTIME_LIB=1`` (the runtime
library without the compiler, as on a runtime-only worker). Writing takes objects built by
``tuner.compile`` but never imports it.

Layout: ``-o model.so`` writes ``model.so`` and ``model.json``; any other path is a folder
holding ``model.so`` and ``metadata.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
import tvm.runtime.vm  # not imported by `import tvm` under TVM_USE_RUNTIME_LIB=1

from tuner.errors import UserInputError
from tuner.native_log import native_output
from tuner.threads import size_thread_pool

if TYPE_CHECKING:
    from tuner.app.run import LatencyStats

logger = logging.getLogger(__name__)

FORMAT = "nightshift-artifact/1"
LIBRARY = "model.so"
METADATA = "metadata.json"
#: Largest scaled error (max |out - ref| / max |ref|) a verified fp32 build may have.
TOLERANCE = 1e-2


@dataclass(frozen=True)
class Verification:
    """How a build's output was checked: against what, how far off, and whether it passed."""

    reference: str
    max_error: float
    tolerance: float = TOLERANCE

    @property
    def ok(self) -> bool:
        """Whether the error is finite and within the tolerance."""
        return bool(np.isfinite(self.max_error)) and self.max_error <= self.tolerance

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (an infinite error, from mismatched shapes, as None)."""
        finite = bool(np.isfinite(self.max_error))
        return {"reference": self.reference, "max_error": self.max_error if finite else None,
                "tolerance": self.tolerance, "ok": self.ok}  # fmt: skip


def paths(path: Path) -> tuple[Path, Path]:
    """``(library, metadata)`` of an artifact at ``path`` (see the module docstring)."""
    if path.suffix == ".so":
        return path, path.with_suffix(".json")
    return path / LIBRARY, path / METADATA


def scaled_error(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> float:
    """max |out - ref| / max |ref| over all outputs; inf if their number or shapes differ."""
    if len(reference) != len(outputs):
        return float("inf")
    worst = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        if np.shape(ref) != np.shape(out):
            return float("inf")
        ref64 = np.asarray(ref, dtype=np.float64)
        scale = max(float(np.max(np.abs(ref64))) if ref64.size else 0.0, 1e-6)
        diff = np.abs(ref64 - np.asarray(out, dtype=np.float64))
        worst = max(worst, float(np.max(diff)) / scale if diff.size else 0.0)
    return worst if np.isfinite(worst) else float("inf")


def onnx_reference(onnx_path: str, inputs: Sequence[np.ndarray], threads: int) -> tuple[str, list[np.ndarray]] | None:
    """The outputs of ONNX Runtime on ``onnx_path``, labelled; None where it is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(threads, 1)
    session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    outs = session.run(None, dict(zip(names, inputs, strict=True)))
    return f"ONNX Runtime {ort.__version__}", [np.asarray(o) for o in outs]


def write_artifact(
    path: Path,
    compiled: Any,
    spec: Any,
    device: Any,
    *,
    latency_s: float | None,
    verification: Verification | None,
    untuned_latency_s: float | None = None,
    latency: LatencyStats | None = None,
    baselines: dict[str, Any] | None = None,
    job: dict[str, Any] | None = None,
    source: str | None = None,
    tasks: Sequence[Any] = (),
    outputs: Sequence[np.ndarray] = (),
    precision: dict[str, Any] | None = None,
) -> Path:
    """Export ``compiled`` (a :class:`tuner.compile.Compiled`) and its metadata to ``path``.

    Args:
        path: ``X.so`` (library, with ``X.json`` beside it) or a folder (created).
        compiled: the tuned build; its ``decisions`` give the tuned/fallback counts.
        spec: the model (:class:`tuner.frontends.ModelSpec`): name and data inputs.
        device: the :class:`tuner.device.Device` it was built for.
        latency_s: the tuned build's measured latency (None: not timed, as by ``nightshift compile``).
        verification: how its output was checked (None: not checked).
        untuned_latency_s: TVM's default build's latency, if measured.
        latency: the tuned build's runs (a :class:`tuner.app.run.LatencyStats`): its median,
            quartiles and method, recorded as ``latency``; None: not timed.
        baselines: what the tuned build was judged against (``tvm-fallback``, ``peer``,
            ``untuned``: label, median, quartiles, ``ratio`` = tuned / baseline, lower is better).
        job: the tuning job (``{"id": ..., "name": ...}``).
        source: what ``--model`` said (zoo name, ONNX path, factory).
        tasks: the model's tasks (:class:`tuner.graph.tasks.Task`), for their weights in the report.
        outputs: the tuned build's outputs on the verification input (their shapes and dtypes).
        precision: a bf16/int8 build's precision (``name``) and its accuracy against the fp32
            build; fp32 when None.

    Returns:
        the metadata file's path.

    Raises:
        UserInputError: the path cannot be written.
    """
    library, meta_path = paths(path)
    kinds = [d.kind for d in getattr(compiled, "decisions", {}).values()]
    counts = {k: kinds.count(k) for k in ("tuned", "same-arch", "fallback", "tvm-default")}
    metadata = {
        "format": FORMAT,
        "library": library.name,
        "model": spec.name,
        "source": source or spec.name,
        "params": "bound into the library as constants",
        "device": {"name": device.name, "kind": device.kind, "arch": device.arch, "fingerprint": device.fingerprint,
                   "target": device.target_config, "threads": int(device.target_config.get("num-cores", 0)),
                   "description": device.description},
        "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype}
                   | ({"bounds": list(i.bounds)} if i.bounds else {}) for i in spec.inputs],
        "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype)} for o in outputs],
        "operators": counts,
        "precision": precision or {"name": "fp32"},
        "tasks": [{"name": t.name, "workload_key": t.workload_key, "weight": t.weight, "flops": t.flops,
                   "choice": t.choice}
                  for t in tasks],
        "latency_ms": None if latency_s is None else latency_s * 1e3,
        "untuned_latency_ms": None if untuned_latency_s is None else untuned_latency_s * 1e3,
        "latency": None if latency is None else latency.to_json(),
        "baselines": baselines or {},
        "verification": None if verification is None else verification.to_json(),
        "job": job,
        "tvm_version": tvm.__version__,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        with native_output():  # TVM's per-save "Scope Saving" lines go to the log, not the terminal
            compiled.executable.export_library(str(library))
        meta_path.write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    except OSError as err:
        raise UserInputError(f"cannot write the artifact {path}: {err.strerror or err}") from err
    return meta_path


@dataclass(frozen=True)
class Artifact:
    """A loaded artifact: its metadata and the VM on the device it was built for."""

    path: Path
    metadata: dict[str, Any]
    vm: Any
    dev: Any

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """``[{"name", "shape", "dtype"}]`` of the model's data inputs, in order."""
        return list(self.metadata.get("inputs", []))

    def check_inputs(self, arrays: Sequence[np.ndarray]) -> None:
        """Raise :class:`UserInputError` unless ``arrays`` match the inputs (see :func:`check_inputs`)."""
        check_inputs(self.metadata, arrays)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run ``main`` on ``arrays`` (checked first); its outputs as numpy arrays."""
        self.check_inputs(arrays)
        args = [tvm.runtime.tensor(np.ascontiguousarray(a), self.dev) for a in arrays]
        return _flatten(self.vm["main"](*args))

    def time(self, arrays: Sequence[np.ndarray], repeat: int) -> list[float]:
        """Seconds of ``repeat`` runs of ``main`` after one warm-up, each copying the inputs in and
        the outputs out (:func:`tuner.app.run.time_runs`, as ``tune`` and ``bench`` time a build)."""
        from tuner.app.run import time_runs

        self.check_inputs(arrays)  # once: a check per run would be timed as the model's
        arrays = [np.ascontiguousarray(a) for a in arrays]

        def call() -> list[np.ndarray]:
            return _flatten(self.vm["main"](*[tvm.runtime.tensor(a, self.dev) for a in arrays]))

        return time_runs(call, repeat)


def read_metadata(path: Path) -> dict[str, Any]:
    """The metadata of the artifact at ``path``.

    Raises:
        UserInputError: no artifact there, or its metadata is not an artifact's.
    """
    _, meta_path = paths(path)
    if not path.exists():
        raise UserInputError(f"no artifact at {path}: pass the .so or the folder that tune -o wrote")
    if not meta_path.is_file():
        raise UserInputError(f"{path}: its metadata {meta_path} is missing; write the artifact with tune -o")
    try:
        metadata = json.loads(meta_path.read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(f"{meta_path}: not readable as JSON ({err})") from err
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise UserInputError(f"{meta_path}: not a Nightshift artifact's metadata (format {FORMAT} expected)")
    return metadata


def check_inputs(metadata: dict[str, Any], arrays: Sequence[np.ndarray]) -> None:
    """Raise :class:`UserInputError` unless ``arrays`` match the metadata's inputs: number, shapes,
    dtypes, and for an input that indexes a table (token ids), its ``bounds``: TVM's gather
    does not check them, and an index beyond the table crashes the process or reads garbage."""
    want = list(metadata.get("inputs", []))
    if len(arrays) != len(want):
        names = ", ".join(w["name"] for w in want)
        raise UserInputError(f"the model takes {len(want)} input(s) ({names}), got {len(arrays)}")
    for a, w in zip(arrays, want, strict=True):
        if list(a.shape) != list(w["shape"]) or str(a.dtype) != w["dtype"]:
            raise UserInputError(f"input {w['name']}: expected shape {tuple(w['shape'])} {w['dtype']}, "
                                 f"got {tuple(a.shape)} {a.dtype}")  # fmt: skip
        if w.get("bounds") and a.size:
            lo, hi = w["bounds"]
            outside = np.argwhere((a < lo) | (a >= hi))
            if len(outside):
                at = tuple(int(i) for i in outside[0])
                raise UserInputError(
                    f"input {w['name']}: {a[at]} at {at} is outside [{lo}, {hi}): it indexes a table of {hi} "
                    f"entries (e.g. a vocabulary); {len(outside)} value(s) out of range")


def load_artifact(path: Path, *, threads: int | None = None) -> Artifact:
    """Load the artifact at ``path`` with TVM's runtime on the device it was built for.

    Args:
        path: ``X.so`` (with ``X.json``) or the artifact's folder.
        threads: CPU threads (default: those it was tuned on, the metadata's ``device.threads``).

    Raises:
        UserInputError: files missing or unreadable, or the device not on this machine.
    """
    metadata = read_metadata(path)
    library, _ = paths(path)
    if not library.is_file():
        raise UserInputError(f"{path}: its library {library} is missing")
    device = metadata.get("device", {})
    kind = device.get("kind", "cpu")
    try:
        with native_output():  # TVM prints "Scope Loaded" lines on every load: to the log instead
            module = tvm.runtime.load_module(str(library))
    except Exception as err:  # TVM raises its own error kinds for a corrupt library
        raise UserInputError(f"cannot load {library}: {str(err).splitlines()[0] if str(err) else err}") from err
    if kind == "cpu":
        dev = tvm.cpu(0)
        cores = threads if threads is not None else int(device.get("threads") or 0)
        if cores > 0:
            # TVM's pool takes half the logical CPUs by default; the artifact was timed on ``cores``.
            size_thread_pool(cores)
    else:
        index = int(str(device.get("name", "cuda:0")).partition(":")[2] or 0)
        dev = tvm.device(kind, index)
        if not dev.exist:
            raise UserInputError(f"the artifact was built for {device.get('name')}, which is not on this machine")
    with native_output():
        vm = tvm.runtime.vm.VirtualMachine(module, dev)
    return Artifact(path, metadata, vm, dev)


def load_inputs(files: Sequence[Path], specs: Sequence[dict[str, Any]]) -> list[np.ndarray]:
    """Arrays from ``.npy`` files (one per input, in order) or one ``.npz`` (keyed by input name).

    Raises:
        UserInputError: a file is missing or not numpy's, or an input is absent from an ``.npz``.
    """
    arrays: list[np.ndarray] = []
    for f in files:
        if not f.is_file():
            raise UserInputError(f"--input {f}: no such file")
        try:
            data = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise UserInputError(f"--input {f}: not a .npy or .npz file ({err})") from err
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                missing = [s["name"] for s in specs if s["name"] not in data.files]
                if missing:
                    raise UserInputError(f"--input {f}: no array named {', '.join(missing)} "
                                         f"(it holds {', '.join(data.files) or 'none'})")  # fmt: skip
                arrays.extend(data[s["name"]] for s in specs)
        else:
            arrays.append(data)
    return arrays


def _flatten(out: Any) -> list[np.ndarray]:
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [x for o in out for x in _flatten(o)]
