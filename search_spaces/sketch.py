"""Spaces built from TVM MetaSchedule's sketches, with their sampling decisions as knobs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Instruction, Trace

from search_spaces.base import MAX_TRIES, InvalidPointError, Point, SearchSpace
from search_spaces.constraints import Limits, limits_for, target_with_limits
from search_spaces.cuda.thread_bounds import ThreadBound, count_within, thread_bounds
from search_spaces.knobs import Knob, tile_choices
from search_spaces.preload import preload_tensor_intrinsics

logger = logging.getLogger(__name__)

# Block annotations whose value TVM's sketch rules fix from the target; exposed as knobs
# because the parallel extent and the vector width are decisions like any other.
_ANNOTATION_KNOBS = ("meta_schedule.parallel", "meta_schedule.vectorize")

# What TVM raises when a schedule primitive or a replayed trace fails (its errors map to
# Python's built-in exception types; ScheduleError derives from RuntimeError).
_TVM_ERRORS = (RuntimeError, ValueError)

# Draws per replay attempt in ``sample`` until one passes the static (thread-extent) bounds.
_STATIC_DRAWS = 1000


@dataclass(frozen=True)
class _KnobSite:
    """Where a knob lives in a sketch's instruction list, and what it is."""

    inst: int
    knob: Knob


class SketchSpace(SearchSpace):
    """TVM's ``post-order-apply`` design spaces for a target, one knob per decision.

    The sketches come from MetaSchedule's own schedule rules (multi-level tiling,
    auto-inline, parallel-vectorize-unroll, cross-thread reduction, thread binding...); each
    ``Sample*`` instruction of a sketch's trace is one knob, and so is the value of the
    parallel and vectorize annotations. Knob domains are read off the sketch by replaying it
    (loop extents for tiles, candidate lists for categoricals, TVM's own compute-location
    candidates). Applying a point replays the sketch with the point's decisions, then TVM's
    postprocessors for the target (which include ``VerifyGPUCode`` with the target's limits
    on CUDA) decide whether it is valid.
    """

    kind = "sketch"
    counts_builds = True  # every replay of a sketch, whatever it is for

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target, *, seed: int = 1,
                 limits: Limits | None = None) -> None:
        target = target_with_limits(target)
        super().__init__(mod, target)
        self.limits = limits or limits_for(target)
        self._block = _short_block(mod, self.limits.vector_bits // 32)
        preload_tensor_intrinsics()
        ctx = ms.TuneContext(
            mod=mod, target=target, space_generator="post-order-apply",
            task_name="space", rand_state=max(seed, 1), num_threads=1,
        )  # fmt: skip
        self._postprocs = list(ctx.space_generator.postprocs)
        self._insts: list[list[Instruction]] = []
        self._sites: list[tuple[_KnobSite, ...]] = []
        for design in ctx.space_generator.generate_design_space(mod):
            insts = [i for i in design.trace.insts if i.kind.name != "EnterPostproc"]
            self._insts.append(insts)
            self._sites.append(self._read_knobs(insts, design.trace.decisions))
        self._knobs = [tuple(s.knob for s in sites) for sites in self._sites]
        max_threads = self.limits.gpu.get("max_threads_per_block", 0)
        self._bounds: list[tuple[ThreadBound, ...]] = [
            thread_bounds(insts, {site.inst: n for n, site in enumerate(sites)}, max_threads) if max_threads else ()
            for insts, sites in zip(self._insts, self._sites, strict=True)
        ]
        logger.debug("sketch space: %d sketches, grid %d", len(self._insts), self.grid_size())

    @property
    def num_sketches(self) -> int:
        return len(self._insts)

    def knobs(self, sketch: int) -> tuple[Knob, ...]:
        return self._knobs[sketch]

    def starts(self) -> list[Point]:
        """For a sketch with nothing to tile or place (an elementwise, broadcast or layout
        function: its only knobs are the parallel and vectorize annotations), the point that
        vectorizes by one register of fp32 lanes (by the block of an output blocked by
        fewer, :func:`_short_block`) over four jobs a core. Such a task gets one
        or two trials in a model of a hundred tasks, and the widths above one register can
        cost 15x: a broadcast multiply in the blocked layout, ``[1, 60, 33, 33, 16]`` by
        ``[1, 60, 1, 1, 16]`` on a Zen 4, ran in 0.10-0.12 ms at 16 lanes and 1.4-1.8 ms at
        32 or 64, whatever the parallel extent (the wider loop crosses the broadcast's block;
        benchmarks/archive/broadcast_vector_width.py)."""
        lanes = self._block or self.limits.vector_bits // 32
        out: list[Point] = []
        for sketch in range(self.num_sketches):
            knobs = self.knobs(sketch)
            if not knobs or any(k.kind != "annotation" for k in knobs):
                continue
            values = []
            for k in knobs:
                want = lanes if k.name.startswith("vectorize") else self.limits.num_cores * 4
                values.append(want if want in k.choices else k.choices[len(k.choices) // 2])
            point = Point(sketch, tuple(values))
            if self.static_violation(point) is None:
                out.append(point)
        return out

    def sample(self, rng: np.random.Generator) -> Point:
        """Each unconditional knob uniformly from its domain; compute locations from TVM's
        own candidates for the tiling drawn (so they are always valid)."""
        # GPU limits reject most uniform tilings of large loops; allow more draws there. A draw
        # that breaks a static bound costs microseconds, a replay milliseconds: only replays count.
        tries = MAX_TRIES * (4 if self.limits.gpu else 1)
        for _ in range(tries):
            for _ in range(_STATIC_DRAWS):
                sketch = int(rng.integers(self.num_sketches))
                values: list[Any] = [
                    None if k.conditional else k.choices[int(rng.integers(len(k)))] for k in self.knobs(sketch)
                ]
                if not self._constraint_violation(Point(sketch, tuple(v if v is not None else 0 for v in values))):
                    break
            else:
                continue
            sch = Schedule(self.mod, seed=int(rng.integers(1, 2**31 - 1)))
            try:
                drawn = self._replay(sch, sketch, values)
            except _TVM_ERRORS:
                continue
            point = Point(sketch, drawn)
            # The replay that drew the compute locations is the point's schedule: it is
            # post-processed and cached as is, so the point is never replayed again.
            if not isinstance(self._cached(point, lambda sch=sch: self._postprocess(sch)), str):
                return point
        raise RuntimeError(f"no valid point after {tries} samples")

    def _constraint_violation(self, point: Point) -> str | None:
        # The unroll and vector-width bounds are applied to the knob domains themselves (see
        # _read_knobs); GPU thread extents depend on several knobs at once.
        knobs = self.knobs(point.sketch)
        for bound in self._bounds[point.sketch]:
            why = bound.violation(point.decisions, knobs)
            if why is not None:
                return why
        return None

    def _static_count(self, sketch: int) -> int:
        if not self._bounds[sketch]:
            return super()._static_count(sketch)
        return count_within(self._bounds[sketch], self.knobs(sketch))

    def _schedule(self, point: Point) -> Schedule:
        sch = Schedule(self.mod, seed=1)
        try:
            got = self._replay(sch, point.sketch, list(point.decisions))
        except _TVM_ERRORS as err:
            raise InvalidPointError(f"sketch replay failed: {_last_line(err)}") from None
        if got != point.decisions:
            bad = [k.name for k, a, b in zip(self.knobs(point.sketch), got, point.decisions, strict=True) if a != b]
            raise InvalidPointError(f"knobs {bad} take values TVM does not offer for the other knobs' values")
        return self._postprocess(sch)

    def _postprocess(self, sch: Schedule) -> Schedule:
        """Run the target's postprocessors on a replayed sketch.

        Raises:
            InvalidPointError: a postprocessor rejects the schedule.
        """
        sch.enter_postproc()
        for post in self._postprocs:
            if not post.apply(sch):
                raise InvalidPointError(f"rejected by TVM postprocessor {type(post).__name__}")
        why = vectorized_vectors(sch.mod)
        if why is not None:
            raise InvalidPointError(why)
        return sch

    def from_trace(self, trace: Trace) -> Point:
        """The point of a trace made by :meth:`to_trace` (or by MetaSchedule from the same
        sketches): the inverse of ``to_trace``.

        Raises:
            InvalidPointError: the trace comes from none of this space's sketches.
        """
        cut = next((n for n, i in enumerate(trace.insts) if i.kind.name == "EnterPostproc"), len(trace.insts))
        insts = list(trace.insts[:cut])
        for s, sketch in enumerate(self._insts):
            if len(sketch) != len(insts) or self._shape(s, insts) != self._shape(s, sketch):
                continue
            values = []
            for site in self._sites[s]:
                inst = insts[site.inst]
                if site.knob.kind == "annotation":
                    values.append(int(inst.inputs[1]))
                else:
                    values.append(_to_py(trace.decisions[inst]))
            point = Point(s, tuple(values))
            if self.static_violation(point) is None:
                return point
        raise InvalidPointError("trace matches none of this space's sketches")

    # --- internals -----------------------------------------------------------------------

    def _shape(self, sketch: int, insts: list[Instruction]) -> str:
        """The text of a trace with sketch ``sketch``'s knob values blanked out: equal for
        two traces exactly when they are the same sketch with different decisions."""
        insts = list(insts)
        for site in self._sites[sketch]:
            if site.knob.kind == "annotation" and site.inst < len(insts):
                insts[site.inst] = _with_annotation_value(insts[site.inst], 0)
        return str(Trace(insts, {}))

    def _replay(self, sch: Schedule, sketch: int, values: list[Any]) -> tuple[Any, ...]:
        """Replay a sketch with the given knob values (None: let TVM draw it) and return the
        values it took. Annotation knobs become the annotation's value."""
        sites = self._sites[sketch]
        insts = list(self._insts[sketch])
        by_inst: dict[int, int] = {}
        for n, site in enumerate(sites):
            if site.knob.kind == "annotation":
                insts[site.inst] = _with_annotation_value(insts[site.inst], int(values[n]))
            else:
                by_inst[site.inst] = n
        taken: list[Any] = list(values)

        def provide(k: int, inst: Instruction, inputs: list, decision: Any) -> Any:
            n = by_inst.get(k)
            return decision if n is None or values[n] is None else _to_tvm(values[n])

        Trace(insts, {}).apply_to_schedule(sch, remove_postproc=True, decision_provider=_indexed(provide, insts))
        decisions = sch.trace.decisions
        sampled = [i for i in sch.trace.insts if i.kind.name.startswith("Sample")]
        knob_sites = [s for s in sites if s.knob.kind != "annotation"]
        if len(sampled) != len(knob_sites):
            raise InvalidPointError("sketch replay produced a different number of decisions")
        it = iter(sampled)
        for n, site in enumerate(sites):
            if site.knob.kind != "annotation":
                taken[n] = _to_py(decisions[next(it)])
        self.built[Point(sketch, tuple(taken)).to_json()] += 1
        return tuple(taken)

    def _read_knobs(self, insts: list[Instruction], decisions: dict) -> tuple[_KnobSite, ...]:
        """Knob domains of one sketch, read by replaying it with TVM's own decisions."""
        sch = Schedule(self.mod, seed=1)
        found: dict[int, dict[str, Any]] = {}

        def provide(k: int, inst: Instruction, inputs: list, decision: Any) -> Any:
            name = inst.kind.name
            if name == "SamplePerfectTile":
                loop = sch.get(inputs[0])
                found[k] = {"extent": int(loop.extent), "loop": str(loop.loop_var.name)}
            elif name == "SampleComputeLocation":
                found[k] = {"block": sch.get(inputs[0]).name_hint,
                            "locations": _compute_locations(sch, inputs[0])}
            return decision

        Trace(insts, dict(decisions)).apply_to_schedule(
            sch, remove_postproc=True, decision_provider=_indexed(provide, insts))
        sites: list[_KnobSite] = []
        names: dict[str, int] = {}

        def unique(name: str) -> str:
            names[name] = names.get(name, 0) + 1
            return name if names[name] == 1 else f"{name}#{names[name]}"

        for k, inst in enumerate(insts):
            name = inst.kind.name
            attrs = list(inst.attrs)
            if name == "SamplePerfectTile":
                n, max_inner = int(attrs[0]), int(attrs[1])
                info = found[k]
                max_inner = max_inner if max_inner > 0 else info["extent"]
                sites.append(_KnobSite(k, Knob(unique(f"tile.{info['loop']}"), "tile",
                                               tile_choices(info["extent"], n, max_inner))))
            elif name == "SampleCategorical":
                candidates = tuple(int(c) for c in attrs[0])
                usage = _usage(insts, k)
                allowed = tuple(i for i, c in enumerate(candidates) if self._categorical_ok(usage, c))
                sites.append(_KnobSite(k, Knob(unique(usage), "categorical", allowed, candidates)))
            elif name == "SampleComputeLocation":
                info = found[k]
                sites.append(_KnobSite(k, Knob(unique(f"compute_at.{info['block']}"), "compute_location",
                                               tuple(info["locations"]), conditional=True)))
            elif name.startswith("Sample"):
                raise NotImplementedError(f"sketch instruction {name} is not exposed as a knob yet")
            elif name == "Annotate" and str(attrs[0]) in _ANNOTATION_KNOBS and _is_int(inst.inputs[1]):
                key = str(attrs[0]).rsplit(".", 1)[-1]
                default = int(inst.inputs[1])
                choices = self._annotation_choices(key, default)
                sites.append(_KnobSite(k, Knob(unique(key), "annotation", choices)))
        # Compute locations offered by TVM depend on which tiled loops have extent 1. The
        # domain is what TVM offers when every tile level is as split as it can be (the most
        # locations), not what the seed-dependent sketch decisions offer, so that the knobs
        # of a space do not depend on its seed.
        spread = self._spread_locations(insts, decisions, sites)
        out = []
        for site in sites:
            if site.knob.kind == "compute_location" and site.inst in spread:
                widest = tuple(sorted(spread[site.inst]))
                site = _KnobSite(site.inst, Knob(site.knob.name, "compute_location", widest, conditional=True))
            out.append(site)
        return tuple(out)

    def _spread_locations(self, insts: list[Instruction], decisions: dict,
                          sites: list[_KnobSite]) -> dict[int, list[int]]:
        if not any(s.knob.kind == "compute_location" for s in sites):
            return {}
        spread = dict(decisions)
        for site in sites:
            if site.knob.kind == "tile":
                best = max(site.knob.choices, key=lambda t: sum(f > 1 for f in t))
                spread[insts[site.inst]] = _to_tvm(best)
        sch = Schedule(self.mod, seed=1)
        out: dict[int, list[int]] = {}

        def provide(k: int, inst: Instruction, inputs: list, decision: Any) -> Any:
            if inst.kind.name == "SampleComputeLocation":
                out[k] = _compute_locations(sch, inputs[0])
            return decision

        try:
            Trace(insts, spread).apply_to_schedule(sch, remove_postproc=True,
                                                   decision_provider=_indexed(provide, insts))
        except _TVM_ERRORS:
            return {}
        return out

    def _categorical_ok(self, usage: str, candidate: int) -> bool:
        if usage == "unroll_explicit" or usage == "unroll_implicit":
            return candidate <= self.limits.max_unroll_step
        return True

    def _annotation_choices(self, key: str, default: int) -> tuple[int, ...]:
        if key == "parallel":
            return self.limits.parallel_choices(default)
        choices = self.limits.vectorize_choices(default)
        # A vector of whole registers spans several blocks of an output blocked by fewer
        # lanes (NCHW8c under AVX-512, or a tensor of 12 channels in one block), so that a broadcast operand
        # becomes a gather.
        return tuple(sorted({*choices, self._block})) if self._block else choices


def _short_block(mod: tvm.IRModule, lanes: int) -> int | None:
    """The innermost extent of ``main``'s blocked output (its last parameter) where it is
    from 4 to under ``lanes``: the channel block of a layout narrower than a register (NCHW8c under
    AVX-512, or 12 channels in one block). On a Zen 4, a broadcast multiply
    ``[1, 15, 65, 65, 8]`` by ``[1, 15, 1, 1, 8]`` ran in 0.06-0.07 ms vectorized by 8 and
    0.51-0.72 ms by any of 16, 32 or 64; ``[1, 8, 65, 65, 15]`` in 0.07-0.08 ms by 15 and
    1.1-1.2 ms by 16-64 (benchmarks/archive/broadcast_vector_width.py; 14 ms in one tuning
    trial of DeepLab-v3)."""
    func = mod["main"]
    if not isinstance(func, tvm.tirx.PrimFunc) or not func.params:
        return None
    shape = list(getattr(getattr(func.params[-1], "ty", None), "shape", None) or [])
    # Rank 5 and up: a blocked layout (NCHW[x]c), whose innermost axis is the channel block;
    # a plain layout's innermost axis is a width, which a vector may cross freely.
    if len(shape) < 5 or not isinstance(shape[-1], tvm.tirx.IntImm):
        return None
    inner = int(shape[-1])
    return inner if 4 <= inner < lanes else None


def _indexed(provide: Callable, insts: list[Instruction]) -> Callable:
    """Adapt ``provide(k, inst, inputs, decision)`` (k: the instruction's position in
    ``insts``) to TVM's decision-provider signature. TVM hands back the trace's own
    instruction objects, wrapped anew, so they are matched with ``same_as``."""

    def wrapped(inst: Instruction, inputs: list, attrs: list, decision: Any) -> Any:
        if not inst.kind.name.startswith("Sample"):
            return decision
        k = next(n for n, i in enumerate(insts) if i.same_as(inst))
        return provide(k, inst, inputs, decision)

    return wrapped


def _compute_locations(sch: Schedule, block_rv: Any) -> list[int]:
    """TVM's valid compute-at locations of a block in the schedule's current state.

    TVM keeps a given decision only when it is one of its candidates, and otherwise draws a
    new one; probing each loop index on a copy of the schedule reads the candidate list.
    """
    name = sch.get(block_rv).name_hint
    n_loops = max((len(sch.get_loops(b)) for b in _all_blocks(sch)), default=0)
    out = []
    for d in range(-2, n_loops):
        probe = sch.copy()
        probe.sample_compute_location(probe.get_sblock(name), decision=d)
        last = probe.trace.insts[-1]
        if int(probe.trace.decisions[last]) == d:
            out.append(d)
    return out


def _all_blocks(sch: Schedule) -> list:
    root = sch.get_sblock("root") if _has_root(sch) else None
    if root is None:
        return []
    return list(sch.get_child_blocks(root))


def _has_root(sch: Schedule) -> bool:
    try:
        sch.get_sblock("root")
    except (_TVM_ERRORS, ValueError):
        return False
    return True


def _usage(insts: list[Instruction], k: int) -> str:
    """What a categorical decision feeds: the annotation key it sets, or the instruction."""
    out = insts[k].outputs[0]
    for inst in insts[k + 1:]:
        if any(i.same_as(out) for i in inst.inputs if hasattr(i, "same_as")):
            if inst.kind.name == "Annotate":
                return str(inst.attrs[0]).rsplit(".", 1)[-1]
            return inst.kind.name.lower()
    return "categorical"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, tvm.tirx.IntImm))


def _with_annotation_value(inst: Instruction, value: int) -> Instruction:
    old = inst.inputs[1]
    new = tvm.tirx.IntImm(str(old.ty), value) if isinstance(old, tvm.tirx.IntImm) else value
    return Instruction(inst.kind, [inst.inputs[0], new], list(inst.attrs), list(inst.outputs))


def _to_py(value: Any) -> Any:
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return tuple(int(v) for v in value)
    return int(value)


def _to_tvm(value: Any) -> Any:
    # TVM's sampling instructions take their decisions as plain integers.
    if isinstance(value, tuple):
        return list(value)
    return value



def _last_line(err: Exception) -> str:
    # TVM's errors carry the whole TIR in front of the one line that says what failed.
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def vectorized_vectors(mod: tvm.IRModule) -> str | None:
    """Why a scheduled module would vectorize code that is vector already, or None.

    MetaSchedule's vectorize postprocessor fuses and vectorizes a block's innermost loops up
    to the annotation's width without asking whether they hold a tensorized instruction
    (``vpdpbusd`` on 64 bytes): TVM's vectorizer then fails ("Cannot broadcast lanes=32 ...
    to 128") or crashes the build process with a segfault, which costs a worker restart
    twice (Ray retries it). BERT-base int8 on a Zen 4 lost 84 of 2,048 trials that way,
    43 of them crashes (2026-11-28).
    """
    found: list[str] = []

    def vector(node: Any) -> None:
        if isinstance(node, tvm.tirx.For) and node.kind == tvm.tirx.ForKind.VECTORIZED:
            found.append(f"vectorized loop {node.loop_var.name} inside a vectorized loop")
        elif isinstance(getattr(node, "ty", None), tvm.ir.PrimType) and tvm.DataType(node.ty.dtype).lanes > 1:
            found.append(f"vectorized loop over a {node.ty.dtype} expression")

    def loop(node: tvm.tirx.For) -> None:
        if not found and node.kind == tvm.tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(node.body, vector)

    for func in mod.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loop))
    return found[0] if found else None
