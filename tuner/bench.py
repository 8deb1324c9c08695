"""``nightshift bench``: Nightshift's builds against the runtimes a user would deploy instead.

One process, one random input, one thread count (the device's ``num-cores``) for everyone:
the build from the tuning database, the zero-trial fallback build (every operator on the
fallback schedule), and the installed peers (ONNX Runtime, OpenVINO at f32 with
``INFERENCE_PRECISION_HINT=f32`` and at its default precision, bf16 on CPUs with AVX512_BF16
or AMX, labelled as it reports it, PyTorch eager and ``torch.compile``) all run the same
network. Zoo models reach the peers as the same network rebuilt in PyTorch (:mod:`tuner.peers.torch_zoo`) with the zoo's
weights, exported to ONNX; ONNX models as the file itself. Runs are interleaved in rounds,
because this project's machines drift by 1.5x within minutes: every round runs every entry
once (after a 0.1 s pause and an untimed warm-up run, which let the previous runtime's
threads go idle), starting at a different entry each round. Outputs are compared with a reference
peer, so a network that differs between runtimes shows up as an error, not as a speed.
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from tuner.app.run import TIMING_METHOD, WARMUP_S, LatencyStats, time_runs
from tuner.device import Device
from tuner.errors import UserInputError, install_hint
from tuner.frontends import ModelSpec
from tuner.native_log import native_output
from tuner.peers import Peer, PeerModel, PeerSkipped, create
from tuner.precision import Precision

logger = logging.getLogger(__name__)

#: Peers a benchmark runs unless told otherwise, in table order.
DEFAULT_PEERS = ("onnxruntime", "openvino-f32", "openvino", "torch", "torch.compile")
#: The peers ``tune``'s closing table picks its one comparison from (f32, quick to prepare).
QUICK_PEERS = ("onnxruntime", "openvino-f32")
#: Installs every peer and what the zoo's export needs.
BENCH_EXTRA = install_hint("bench")

TVM_DB = "tvm"
TVM_FALLBACK = "tvm-fallback"

Status = Literal["ok", "skipped", "failed"]


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """How to benchmark.

    Attributes:
        rounds: timed runs of every entry, one per round.
        warmup_per_round: untimed runs before each timed one (at least; more until
            ``warmup_s`` seconds have passed, as every timing does: :func:`tuner.app.run.time_runs`).
        settle_s: idle seconds before each entry's warm-up. ONNX Runtime's threads stay busy
            after a run: on a 2-core Zen 4 (2026-11-27), OpenVINO's int8 ResNet-50 right after
            it took a median 19.95 ms (12.0-32.3) against 14.40 with a 0.1 s pause, which a
            warm-up run of its own did not absorb (benchmarks/runtime_interference.py).
        peers: peer names (see :data:`tuner.peers.PEERS`) or instances, in table order.
        fallback: also build and run the zero-trial fallback build.
        tolerance: largest scaled error (max |a - ref| / max |ref|) of an f32 entry.
        low_precision_tolerance: the same for entries a runtime ran in bf16/f16.
        seed: seed of the random input.
        plan: the layout plan both TVM builds use (a :class:`tuner.graph.layout.plan.LayoutPlan`; None:
            the target's default), as in the tuning job.
        precision: the TVM builds' precision (``fp32``, ``bf16``, ``int8``; see
            :mod:`tuner.precision`); other than fp32, their accuracy against TVM's fp32
            build is measured on ``accuracy_inputs`` inputs (0: not here; the caller does).
        layout_choice: how ``--layout auto`` chose ``plan`` (a
            :class:`tuner.graph.layout.choose.PlanChoice`), recorded in the JSON; None for a fixed plan.
        reference_spec: the float model a quantized model was made from
            (:mod:`tuner.precision.quantize`): the accuracy reference instead of the quantized
            graph run in fp32.
    """

    rounds: int = 10
    warmup_per_round: int = 1
    warmup_s: float = WARMUP_S
    settle_s: float = 0.1
    peers: tuple[str | Peer, ...] = DEFAULT_PEERS
    fallback: bool = True
    tolerance: float = 1e-3
    low_precision_tolerance: float = 5e-2
    seed: int = 0
    plan: Any = None
    precision: str = "fp32"
    accuracy_inputs: int = 8
    layout_choice: Any = None
    reference_spec: Any = None

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise UserInputError(f"--rounds must be a positive integer, got {self.rounds}")
        if self.warmup_per_round < 0:
            raise ValueError(f"warmup_per_round must be >= 0, got {self.warmup_per_round}")


class Runner(Protocol):
    """What the rounds run: a peer after ``prepare``, or a TVM build."""

    label: str
    precision: str

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run once; the outputs as numpy arrays."""
        ...


class TvmRunner:
    """A compiled model on TVM's Relax VM, on ``device``'s thread count (as ``run_model`` does)."""

    def __init__(self, compiled: Any, device: Device, label: str, precision: str = "f32") -> None:
        import tvm
        from tvm import relax

        device.use_threads()
        self._tvm = tvm
        self._dev = device.tvm_device()
        with native_output():  # it exports and loads the executable: TVM's "Scope" lines, to the log
            self._vm = relax.VirtualMachine(compiled.executable, self._dev)
        self.label = label
        self.precision = precision

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Copy the inputs in, run ``main``, copy the outputs out (as the peers do)."""
        args = [self._tvm.runtime.tensor(x, self._dev) for x in inputs]
        return self._flatten(self._vm["main"](*args))

    def _flatten(self, out: Any) -> list[np.ndarray]:
        if isinstance(out, self._tvm.runtime.Tensor):
            return [out.numpy()]
        return [x for o in out for x in self._flatten(o)]


@dataclass
class Entry:
    """One row of the benchmark: a TVM build or a peer, its timings and its error."""

    key: str
    label: str
    kind: Literal["tvm", "peer"]
    precision: str = "f32"
    status: Status = "ok"
    reason: str = ""
    install: str = ""
    note: str = ""
    samples_s: list[float] = field(default_factory=list)
    max_error: float | None = None
    agrees: bool | None = None

    @property
    def median_s(self) -> float | None:
        """Median latency in seconds (None without samples)."""
        return float(np.median(self.samples_s)) if self.samples_s else None

    @property
    def spread(self) -> float | None:
        """Interquartile range over the median: how much the rounds disagree."""
        if not self.samples_s:
            return None
        q1, q3 = np.percentile(self.samples_s, [25, 75])
        return float((q3 - q1) / max(float(np.median(self.samples_s)), 1e-12))

    @property
    def stats(self) -> LatencyStats | None:
        """The rounds' latency summarised as every output shows it (None without samples)."""
        return LatencyStats.of(self.samples_s) if self.samples_s else None


@dataclass(frozen=True)
class PairedRatio:
    """An entry's latency over the fastest peer's in the same rounds: the median of the
    rounds' ratios, and in how many of the ``rounds`` the entry ran faster."""

    median: float
    faster: int
    rounds: int


@dataclass
class BenchResult:
    """Everything a benchmark measured; :meth:`to_json` is what ``--json`` writes."""

    model: str
    device: Device
    threads: int
    config: BenchConfig
    entries: list[Entry]
    order: list[list[str]]
    reference: str | None
    fastest_peer: str | None
    # The TVM build's accuracy against TVM's fp32 build (reduced precisions only).
    accuracy: Any = None

    def entry(self, key: str) -> Entry:
        """The entry named ``key`` (``tvm``, ``tvm-fallback`` or a peer name)."""
        return next(e for e in self.entries if e.key == key)

    def ratio(self, entry: Entry) -> float | None:
        """``entry``'s median latency over the fastest f32 peer's."""
        if self.fastest_peer is None or entry.median_s is None:
            return None
        return entry.median_s / self.entry(self.fastest_peer).median_s  # type: ignore[operator]

    def paired_ratio(self, entry: Entry) -> PairedRatio | None:
        """``entry`` against the fastest f32 peer round by round: each round ran both once, so
        the median of the rounds' ratios leaves out the host's swings that move both (on the
        2-core cloud machines, a round's latencies swing 1.5-2x together; the ratio of the
        two medians can pair a fast stretch of one with a slow one of the other)."""
        if self.fastest_peer is None or not entry.samples_s:
            return None
        peer = self.entry(self.fastest_peer).samples_s
        if len(peer) != len(entry.samples_s):
            return None
        ratios = [a / b for a, b in zip(entry.samples_s, peer, strict=True)]
        return PairedRatio(float(np.median(ratios)), sum(r < 1 for r in ratios), len(ratios))

    @property
    def ok(self) -> bool:
        """Whether every TVM build that ran agrees with the reference within its tolerance (a
        peer that disagrees is the peer's fault: :attr:`peer_mismatches`)."""
        return all(e.agrees is not False for e in self.entries if e.kind == "tvm")

    @property
    def peer_mismatches(self) -> list[Entry]:
        """The peers whose output differs from the reference's beyond tolerance (left out of
        the ratios: a runtime that computes something else is no speed reference)."""
        return [e for e in self.entries if e.kind == "peer" and e.agrees is False]

    def mismatch_warnings(self) -> list[str]:
        """One line per peer in :attr:`peer_mismatches`, naming the reference."""
        ref = self.entry(self.reference).label if self.reference else "the reference"
        return [f"{e.label}'s output differs from {ref}'s (max error {e.max_error:.1e}): "
                "left out of the ratios" for e in self.peer_mismatches]

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON types."""
        return {
            "model": self.model,
            "device": {"name": self.device.name, "arch": self.device.arch, "fingerprint": self.device.fingerprint,
                       "cpu": self.device.description.get("model")},
            "threads": self.threads,
            "rounds": self.config.rounds,
            "warmup_per_round": self.config.warmup_per_round,
            "warmup_s": self.config.warmup_s,
            "settle_s": self.config.settle_s,
            "timing": f"median of {self.config.rounds} interleaved rounds, one timed run each; {TIMING_METHOD}",
            "tolerance": {"f32": self.config.tolerance, "low_precision": self.config.low_precision_tolerance},
            "reference": self.reference,
            "fastest_peer": self.fastest_peer,
            "ok": self.ok,
            "peer_mismatches": [e.key for e in self.peer_mismatches],
            "precision": self.config.precision,
            "layout_plan": None if self.config.plan is None else str(self.config.plan),
            "layout_choice": None if self.config.layout_choice is None else self.config.layout_choice.to_json(),
            "accuracy_vs_fp32": self.accuracy.to_json() if self.accuracy is not None else None,
            "order": self.order,
            "entries": [
                {"key": e.key, "label": e.label, "kind": e.kind, "precision": e.precision, "status": e.status,
                 "reason": e.reason, "install": e.install, "note": e.note,
                 "median_ms": _ms(e.median_s), "min_ms": _ms(min(e.samples_s) if e.samples_s else None),
                 "spread": e.spread, **_quartiles_json(e), "ratio_to_fastest_peer": self.ratio(e),
                 **_paired_json(self.paired_ratio(e)), "max_error": e.max_error,
                 "agrees": e.agrees, "samples_ms": [s * 1e3 for s in e.samples_s]}
                for e in self.entries
            ],
        }  # fmt: skip


def _paired_json(paired: PairedRatio | None) -> dict[str, Any]:
    return {"per_round_ratio_to_fastest_peer": None if paired is None else paired.median,
            "rounds_faster_than_fastest_peer": None if paired is None else paired.faster}  # fmt: skip


def _quartiles_json(entry: Entry) -> dict[str, float | None]:
    stats = entry.stats
    return {"p25_ms": None if stats is None else stats.p25_ms, "p75_ms": None if stats is None else stats.p75_ms}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def scaled_max_error(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> float:
    """max |out - ref| / max |ref| over all outputs (as ``tune``'s check); inf if shapes differ."""
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


def interleave(
    runners: dict[str, Runner], inputs: list[np.ndarray], *, rounds: int, warmup: int = 1, settle_s: float = 0.0,
    before_round: Callable[[int], None] | None = None, warmup_s: float = 0.0,
) -> tuple[dict[str, list[float]], list[list[str]]]:
    """Time every runner once per round, rotating which one starts each round; ``settle_s``
    seconds of sleep before each runner's warm-up let the previous runtime's threads go idle.
    Each timed run is :func:`tuner.app.run.time_runs`'s, after ``warmup`` untimed runs and more
    until ``warmup_s`` seconds have passed. ``before_round(r)``, when given, runs before round
    ``r`` (a benchmark changing or reading the machine's state between rounds).

    Returns:
        the latencies (seconds) of each runner in round order, and the keys in the order they
        ran, one list per round.
    """
    keys = list(runners)
    samples: dict[str, list[float]] = {k: [] for k in keys}
    order: list[list[str]] = []
    for r in range(rounds):
        start = r % len(keys) if keys else 0
        this_round = keys[start:] + keys[:start]
        if before_round is not None:
            before_round(r)
        for key in this_round:
            runner = runners[key]
            time.sleep(settle_s)
            # One timed run a round, timed as every latency Nightshift prints.
            samples[key] += time_runs(lambda runner=runner: runner.run(inputs), 1, warmup=warmup, warmup_s=warmup_s)
        order.append(this_round)
        logger.debug("round %d/%d: %s", r + 1, rounds, {k: f"{samples[k][-1] * 1e3:.2f} ms" for k in this_round})
    return samples, order


def peer_model(spec: ModelSpec, source: str, workdir: Path) -> PeerModel:
    """The network of ``spec`` in the forms peers take: an ONNX file and a torch module.

    ``source`` is what ``--model`` said: an ONNX path is used as it is; a PyTorch program or an
    ecosystem model (``torchvision:``, ``timm:``, ``hf:``) brings the module it was exported
    from; a zoo model is rebuilt in PyTorch with ``spec.params``. Modules are exported to ONNX
    in ``workdir``.
    """
    if source.lower().endswith(".onnx"):
        return PeerModel(spec.name, Path(source), torch_reason="an ONNX model has no PyTorch module here")
    if spec.torch_module is not None:
        # A PyTorch program or an ecosystem model (torchvision:, timm:, hf:): the module the
        # frontend exported, and its ONNX export for ONNX Runtime and OpenVINO.
        return _exported(spec, spec.torch_module, workdir)
    if ":" in source:
        reason = "this PyTorch program's module is not at hand (the model was not loaded from it here)"
        return PeerModel(spec.name, None, torch_reason=reason, onnx_reason=reason)
    if any(np.dtype(v.dtype) != np.float32 for v in spec.params.values()):
        reason = "peers run float32 zoo models only"
        return PeerModel(spec.name, None, torch_reason=reason, onnx_reason=reason)
    try:
        from tuner.peers.torch_zoo import torch_zoo_model
    except ImportError:
        reason = f"the zoo's PyTorch twin and its ONNX export need torch: {BENCH_EXTRA}"
        return PeerModel(spec.name, None, torch_reason=reason, onnx_reason=reason)
    return _exported(spec, torch_zoo_model(spec), workdir)


def _exported(spec: ModelSpec, module: Any, workdir: Path) -> PeerModel:
    """``module`` for the torch peers and its ONNX export for the others (skipped with the reason
    where the exporter fails)."""
    path = workdir / f"{spec.name}.onnx"
    try:
        export_onnx(module, spec.random_inputs(), [i.name for i in spec.inputs], path)
    except Exception as err:  # the exporter raises many kinds; ORT/OpenVINO then skip with it
        logger.warning("cannot export %s to ONNX: %s", spec.name, err)
        return PeerModel(spec.name, None, module, onnx_reason=f"ONNX export failed: {type(err).__name__}: {err}")
    return PeerModel(spec.name, path, module)


def export_onnx(module: Any, inputs: list[np.ndarray], input_names: list[str], path: Path) -> None:
    """Export ``module`` with torch's TorchScript-based exporter (opset 17).

    torch 2.13's default (dynamo) exporter needs onnxscript; the TorchScript one needs nothing
    more and handles every zoo network.
    """
    import torch

    args = tuple(torch.from_numpy(x) for x in inputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # its deprecation notice; errors still raise
        torch.onnx.export(module, args, str(path), input_names=input_names, opset_version=17,
                          do_constant_folding=True, dynamo=False)  # fmt: skip


def bench(
    spec: ModelSpec,
    device: Device,
    db: Any,
    *,
    source: str,
    config: BenchConfig | None = None,
    compiled: Any | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> BenchResult:
    """Benchmark ``spec`` on ``device``: TVM's database and fallback builds against the peers.

    Where the device lacks the instructions ``config.precision`` needs (and no ``compiled``
    build is given), TVM's row is skipped with the reason and the peers run alone: what the
    CPU gets at that precision without Nightshift.

    Args:
        spec: the model.
        device: a CPU device; its ``num-cores`` is everyone's thread count.
        db: the tuning database (a :class:`tuner.db.TuningDatabase`).
        source: the ``--model`` text (an ONNX path reaches the peers as that file).
        config: how to benchmark.
        compiled: the database build if the caller already has it (``tune`` does).
        on_stage: called with a short description as each stage starts.

    Raises:
        UserInputError: the device is not a CPU.
    """
    config = config or BenchConfig()
    stage = on_stage or (lambda _text: None)
    if device.kind != "cpu":
        raise UserInputError(f"bench compares CPU runtimes; {device.name} is not supported yet (use --device cpu)")
    threads = int(device.target_config.get("num-cores") or 1)
    inputs = spec.random_inputs(seed=config.seed)
    precision = "f16" if any(i.dtype == "float16" for i in spec.inputs) else "f32"
    # Other than fp32, TVM's builds are checked with the low-precision tolerance.
    tvm_precision = config.precision if Precision.parse(config.precision).reduced else precision
    accuracy = None
    entries: list[Entry] = []
    runners: dict[str, Runner] = {}
    outputs: dict[str, list[np.ndarray]] = {}

    def first_run(entry: Entry, runner: Runner) -> None:
        # The first run compiles lazily for some runtimes (torch.compile): a failure is a skip.
        try:
            outputs[entry.key] = runner.run(inputs)
        except Exception as err:  # any runtime's error: this entry is skipped, the others go on
            entry.status, entry.reason = "failed", f"first run failed: {_describe(err)}"
            logger.warning("%s: %s", entry.label, entry.reason)
            return
        runners[entry.key] = runner

    with ExitStack() as stack:
        unsupported = unsupported_reason(config.precision, device) if compiled is None else None
        if unsupported is not None:
            # The peers still run: what this CPU gets at that precision without Nightshift.
            entries.append(Entry(TVM_DB, "TVM", "tvm", config.precision, status="skipped", reason=unsupported))
        else:
            builds, accuracy = _tvm_builds(spec, device, db, config, compiled, stage, stack, tvm_precision)
            for entry, runner in builds:
                entries.append(entry)
                first_run(entry, runner)

        model: PeerModel | None = None
        for item in config.peers:
            peer = create(item)
            entry = Entry(peer.name, peer.label, "peer", install=peer.install)
            entries.append(entry)
            availability = peer.available()
            if not availability:
                entry.status, entry.reason, entry.install = "skipped", availability.reason, availability.install
                continue
            if model is None:
                stage("exporting the network for the peers")
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nightshift-peers-")))
                model = peer_model(spec, source, workdir)
            stage(f"preparing {peer.name}")
            try:
                peer.prepare(model, threads)
            except PeerSkipped as err:
                entry.status, entry.reason = "skipped", str(err)
                continue
            except Exception as err:  # a runtime that cannot load the model is reported, not fatal
                entry.status, entry.reason = "failed", _describe(err)
                logger.warning("%s: %s", peer.name, entry.reason)
                continue
            entry.label, entry.precision = peer.label, peer.precision
            first_run(entry, peer)

        stage(f"{config.rounds} interleaved rounds of {len(runners)} runtimes")
        samples, order = interleave(runners, inputs, rounds=config.rounds, warmup=config.warmup_per_round,
                                    settle_s=config.settle_s, warmup_s=config.warmup_s)  # fmt: skip

    for entry in entries:
        entry.samples_s = samples.get(entry.key, [])
    reference = next((e.key for e in entries if e.kind == "peer" and e.key in outputs and e.precision == "f32"),
                     next((e.key for e in entries if e.key in outputs), None))  # fmt: skip
    if reference is not None:
        for entry in entries:
            if entry.key in outputs:
                entry.max_error = scaled_max_error(outputs[reference], outputs[entry.key])
                # Runtimes round a quantized graph's int8 steps each their own way, whatever
                # precision they were asked for: in an int8 run every entry is low precision.
                exact = entry.precision == precision and config.precision != "int8"
                tol = config.tolerance if exact else config.low_precision_tolerance
                entry.agrees = entry.max_error <= tol
    fast = [e for e in entries
            if e.kind == "peer" and e.samples_s and e.precision == "f32" and e.agrees is not False]
    fastest = min(fast, key=lambda e: e.median_s or 0.0).key if fast else None
    return BenchResult(spec.name, device, threads, config, entries, order, reference, fastest, accuracy)


def _tvm_builds(spec: ModelSpec, device: Device, db: Any, config: BenchConfig, compiled: Any | None,
                stage: Callable[[str], None], stack: ExitStack, tvm_precision: str,
                ) -> tuple[list[tuple[Entry, Runner]], Any]:  # fmt: skip
    """TVM's rows (the database build, ``compiled`` if given, and the fallback build when
    anything was tuned) with their runners, and the database build's accuracy against fp32
    (reduced precisions, ``config.accuracy_inputs`` > 0; else None)."""
    from tuner.compile import compile_model
    from tuner.db import TuningDatabase

    stage("compiling from the database")
    if compiled is None:
        compiled = compile_model(spec, device, db, plan=config.plan, precision=config.precision)
    accuracy = None
    if Precision.parse(config.precision).reduced and config.accuracy_inputs:
        stage(f"measuring {config.precision} accuracy against fp32")
        from tuner.precision.accuracy import measure_accuracy

        fp32 = compile_model(config.reference_spec or spec, device, db, plan=config.plan)
        accuracy = measure_accuracy(spec, device, fp32, compiled, num_inputs=config.accuracy_inputs)
    tuned_any = bool(compiled.tuned)
    label = "TVM, database" if tuned_any else "TVM fallback (no records for this device)"
    stale = compiled.tuned_in_another_form(db) if db is not None else []
    older = f" ({len(stale)} tuned in an older form: re-tune)" if stale else ""
    db_entry = Entry(TVM_DB, label, "tvm", tvm_precision,
                     note=f"{len(compiled.tuned)} ops tuned, {len(compiled.fallback)} untuned{older}, "
                          f"compiled in {compiled.compile_s:.1f} s")  # fmt: skip
    builds: list[tuple[Entry, Runner]] = [(db_entry, TvmRunner(compiled, device, label, tvm_precision))]
    if config.fallback and tuned_any:
        stage("compiling the fallback build")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nightshift-bench-")))
        # A database without records: every operator gets the fallback schedule.
        empty = TuningDatabase(str(tmp / "empty.db"))
        try:
            fallback = compile_model(spec, device, empty, plan=config.plan, precision=config.precision)
        finally:
            empty.close()
        fb_entry = Entry(TVM_FALLBACK, "TVM fallback (0 trials)", "tvm", tvm_precision,
                         note=f"{len(fallback.fallback)} ops on the fallback schedule")  # fmt: skip
        builds.append((fb_entry, TvmRunner(fallback, device, fb_entry.label, tvm_precision)))
    return builds, accuracy


def unsupported_reason(precision: str, device: Device) -> str | None:
    """Why TVM cannot build ``precision`` for ``device`` (the CPU lacks its instructions), or None."""
    from tuner.precision import UnsupportedPrecisionError, check_device

    try:
        check_device(precision, device)
    except UnsupportedPrecisionError as err:
        return str(err)
    return None


def _describe(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


def _fmt_ms(ms: float) -> str:
    return f"{ms:,.1f}" if ms >= 10 else f"{ms:.3g}"


def render(result: BenchResult) -> Any:
    """The result as a rich Table that fits 80 columns: median and IQR (as a share of the
    median) of the rounds, latency as a multiple of the fastest f32 peer's (of the medians, and
    the median of the rounds' ratios with the rounds the entry won; lower is better), max
    error; each row's note (and a skipped peer's reason) in the caption below it."""
    from rich.table import Table

    if result.fastest_peer:
        ratio = f"'x peer' is x of {result.entry(result.fastest_peer).label}, lower is better"
    else:  # ratios are to the fastest f32 peer; a bf16 run may ask for bf16 peers only
        ratio = "no ratios: no f32 peer ran"
    table = Table(title=f"{result.model} on {result.device.name} ({result.device.arch}), {result.threads} threads; "
                        f"median of {result.config.rounds} interleaved rounds ({TIMING_METHOD}); {ratio}")  # fmt: skip
    for col, justify in (("runtime", "left"), ("prec", "left"), ("ms", "right"), ("IQR", "right"),
                         ("x peer", "right"), ("rounds", "right"), ("error", "right")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    notes: list[str] = []
    for e in result.entries:
        if e.status != "ok":
            install = f" ({e.install})" if e.install and e.status == "skipped" else ""
            notes.append(f"{e.label}: {e.status}, {e.reason}{install}")
            table.add_row(e.label, "", e.status, "", "", "", "")
            continue
        if e.note:
            notes.append(f"{e.label}: {e.note}")
        ratio = result.ratio(e)
        error = "" if e.max_error is None else ("ref" if e.key == result.reference else f"{e.max_error:.1e}")
        if e.agrees is False:
            error = f"[red]{error} MISMATCH[/]"
        stats = e.stats
        median = "" if stats is None else _fmt_ms(stats.median_ms)
        iqr = "" if stats is None else f"{stats.spread:.0%}"
        paired = result.paired_ratio(e)
        per_round = "" if paired is None or e.key == result.fastest_peer else \
            f"{paired.median:.2f}x ({paired.faster}/{paired.rounds})"
        table.add_row(e.label, e.precision, median, iqr, "" if ratio is None else f"{ratio:.2f}x", per_round, error)
    table.caption = "IQR: of the rounds, as a share of the median; rounds: the median of the rounds' ratios " \
        "(rounds won)" + "".join(f"\n{n}" for n in notes)
    table.caption_justify = "left"
    return table


@dataclass(frozen=True)
class ClosingComparison:
    """What ``tune``'s closing table adds: the fallback build and the fastest peer, timed in the
    same interleaved rounds as the tuned build.

    Attributes:
        fallback, tuned, peer: median latencies in seconds. ``fallback`` is None when nothing
            was tuned (the tuned build is the fallback build); ``peer`` is None when no peer
            ran (``summary`` says why).
        peer_label: the fastest f32 peer's label ("" when none ran).
        summary: one line for the user: the tuned build as a multiple of each reference.
        agree: whether every TVM build's output agrees with the reference peer's.
        stats: each row's rounds summarised, by key (``tvm``, ``tvm-fallback``, the peer's name).
        rounds: the interleaved rounds.
        peer_key: the fastest peer's key, or None.
    """

    fallback: float | None
    tuned: float
    peer: float | None
    peer_label: str
    summary: str
    agree: bool
    stats: dict[str, LatencyStats] = field(default_factory=dict)
    rounds: int = 0
    peer_key: str | None = None
    peer_mismatches: tuple[str, ...] = ()

    @property
    def tuned_stats(self) -> LatencyStats | None:
        """The tuned build's rounds summarised."""
        return self.stats.get(TVM_DB)

    @property
    def fallback_stats(self) -> LatencyStats | None:
        """The fallback build's rounds summarised (None when nothing was tuned)."""
        return self.stats.get(TVM_FALLBACK)

    @property
    def peer_stats(self) -> LatencyStats | None:
        """The fastest peer's rounds summarised (None when no peer ran)."""
        return None if self.peer_key is None else self.stats.get(self.peer_key)


def ratio_text(latency: float, reference: float, name: str) -> str:
    """``latency`` as a multiple of ``reference``'s, the one way every output writes a ratio:
    ``"1.23x of NAME"`` (lower is better)."""
    return f"{latency / reference:.2f}x of {name}" if reference > 0 else f"n/a of {name}"


def closing_comparison(
    spec: ModelSpec, device: Device, db: Any, compiled: Any, *, source: str, config: BenchConfig
) -> ClosingComparison:
    """Benchmark the tuned build ``compiled`` against the fallback build and ``config.peers``."""
    result = bench(spec, device, db, source=source, config=config, compiled=compiled)
    tuned = result.entry(TVM_DB).median_s or float("nan")
    fallback = next((e.median_s for e in result.entries if e.key == TVM_FALLBACK), None)
    stats = {e.key: e.stats for e in result.entries if e.stats is not None}
    peers = [e for e in result.entries if e.kind == "peer"]
    parts = []
    if fallback is not None:
        parts.append(ratio_text(tuned, fallback, "the fallback build (0 trials)"))
    if result.fastest_peer is None:
        why = "; ".join(f"{e.key}: {e.reason}" for e in peers) or "none asked for"
        missing = any(e.status == "skipped" and e.install for e in peers)
        parts.append(f"no peer ran ({why})" + (f"; {BENCH_EXTRA} to compare with the peers" if missing else ""))
        return ClosingComparison(fallback, tuned, None, "", "tuned build: " + "; ".join(parts), result.ok,
                                 stats, config.rounds, peer_mismatches=tuple(result.mismatch_warnings()))  # fmt: skip
    best = result.entry(result.fastest_peer)
    peer = best.median_s or float("nan")  # the fastest peer is chosen among entries with samples
    parts.append(ratio_text(tuned, peer, best.label))
    errors = [e.max_error or 0.0 for e in result.entries if e.agrees is not None and e.kind == "tvm"]
    summary = (f"tuned build: {'; '.join(parts)} (lower is better; medians of {config.rounds} interleaved rounds); "
               f"max error vs {result.reference} {max(errors, default=0.0):.1e}")  # fmt: skip
    return ClosingComparison(fallback, tuned, peer, best.label, summary, result.ok, stats, config.rounds, best.key,
                             tuple(result.mismatch_warnings()))  # fmt: skip
