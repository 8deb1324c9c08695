"""Chains of operators that only move channels, each output computed in one pass.

ShuffleNet's channel shuffle (concat, reshape, transpose, reshape, split) runs in NCHW:
after ``ConvertLayout`` each one sits between layout transforms of the blocked convs around
it (``NCHW16c`` to ``NCHW``, the shuffle, then back), fused by TVM into one function whose
every element goes through the whole chain's index arithmetic: about a third of the model's
time on a Zen 4 (``benchmarks/results/op_profile_shufflenet_v2_x1_0.json``).

:func:`gather_channel_moves` finds each connected chain of data-movement operators
(layout transforms, concatenations, reshapes, transposes, splits and the channel pads and
cuts of :mod:`tuner.graph.layout.channel_pad`) that holds a transpose or a split, works out
where each of its outputs' elements comes from by running the chain on element numbers in
numpy, and where every element keeps its batch and spatial position and only the channel
moves, replaces the chain by one gather per output: a table, per output channel, of the
input and the channel it reads, in whatever layout each input and output is in (``NCHW`` or
``NCHW{b}c``). A chain that moves anything else (a transformer's head split) is left alone.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import tvm
from tvm import relax, te

from tuner.graph.fold import _OPS as _FOLD_OPS

logger = logging.getLogger(__name__)

_MOVES = frozenset({"relax.layout_transform", "relax.concat", "relax.reshape", "relax.permute_dims", "relax.split"})
#: A chain is gathered only if it holds one of these (layout transforms alone stay as they are).
_SHUFFLES = frozenset({"relax.permute_dims", "relax.split"})
#: The functions of :mod:`tuner.graph.layout.channel_pad` and the channel concatenations of
#: :func:`tuner.graph.layout.rewrites.concat_apart`, by name.
_CHANNEL_FUNCS = ("channel_cut", "channel_pad", "concatenate_channels")


def _func_name(call: relax.Call) -> str | None:
    if call.op.same_as(tvm.ir.Op.get("relax.call_tir")) and isinstance(call.args[0], relax.GlobalVar):
        name = str(call.args[0].name_hint)
        return next((f for f in _CHANNEL_FUNCS if name.startswith(f)), None)
    return None


def _kind(value: relax.Expr) -> str | None:
    """What a binding's value does, if it only moves data: an op name, a channel function's
    name, or ``getitem``."""
    if isinstance(value, relax.TupleGetItem):
        return "getitem"
    if not isinstance(value, relax.Call):
        return None
    if isinstance(value.op, tvm.ir.Op) and value.op.name in _MOVES:
        return value.op.name
    return _func_name(value)


def _vars_in(expr: relax.Expr) -> list[relax.Var]:
    found: list[relax.Var] = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def _shape(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError:  # a symbolic dimension
        return None


def _evaluate(kind: str, value: relax.Expr, env: dict[relax.Var, Any]) -> Any:
    """The binding's value on element labels (int64; -1 for a padded zero)."""
    if kind == "getitem":
        return env[value.tuple_value][value.index]
    call = value
    if kind == "channel_cut":
        (x,) = call.args[1].fields
        out = _shape(call)
        return env[x][:, : out[1]]
    if kind == "channel_pad":
        (x,) = call.args[1].fields
        out = _shape(call)
        a = env[x]
        widths = [(0, o - s) for o, s in zip(out, a.shape, strict=True)]
        return np.pad(a, widths, constant_values=-1)
    if kind == "concatenate_channels":
        return np.concatenate([env[f] for f in call.args[1].fields], axis=1)
    if kind == "relax.concat":
        parts = [env[f] for f in call.args[0].fields]
        return np.concatenate(parts, axis=int(call.attrs.axis))
    if kind == "relax.split":
        sections = call.attrs.indices_or_sections
        axis = int(call.attrs.axis)
        at = int(sections) if isinstance(sections, (int, tvm.tirx.IntImm)) else [int(i) for i in sections]
        return tuple(np.split(env[call.args[0]], at, axis=axis))
    if kind == "relax.layout_transform" and call.attrs.pad_value is not None:
        raise ValueError("padded layout transform")
    args = [env[a] if isinstance(a, relax.Var) else tuple(int(d) for d in a.values) for a in call.args]
    return _FOLD_OPS[kind](call, args)


def gather_channel_moves(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after ``ConvertLayout``, before legalizing) with each channel-moving chain
    replaced by gathers, and the number of chains replaced."""
    func = mod["main"]
    bindings = [b for block in func.body.blocks if isinstance(block, relax.DataflowBlock) for b in block.bindings]
    kinds = {b.var: k for b in bindings if isinstance(b, relax.VarBinding) and (k := _kind(b.value)) is not None}
    values = {b.var: b.value for b in bindings if isinstance(b, relax.VarBinding)}
    # Chains: connected groups of moving bindings (union-find over their reads).
    parent = {v: v for v in kinds}

    def root(v: relax.Var) -> relax.Var:
        while parent[v] is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for var in kinds:
        for read in _vars_in(values[var]):
            if read in kinds:
                parent[root(read)] = root(var)
    chains: dict[relax.Var, list[relax.Var]] = {}
    for var in kinds:  # binding order
        chains.setdefault(root(var), []).append(var)
    readers: dict[relax.Var, set[relax.Var | None]] = {}
    for b in bindings:
        for read in _vars_in(b.value):
            readers.setdefault(read, set()).add(b.var)
    for read in _vars_in(func.body.body):
        readers.setdefault(read, set()).add(None)  # the function's result
    replace: dict[relax.Var, tuple[list[relax.Var], np.ndarray]] = {}
    count = 0
    for members in chains.values():
        if not any(kinds[v] in _SHUFFLES for v in members):
            continue
        gathers = _chain_gathers(members, kinds, values, readers)
        if gathers:
            replace.update(gathers)
            count += 1
    if not replace:
        return mod, 0
    out = _substitute(mod, replace)
    logger.debug("gathered %d channel-moving chains", count)
    return out, count


def _chain_gathers(members: list[relax.Var], kinds: dict, values: dict,
                   readers: dict) -> dict[relax.Var, tuple[list[relax.Var], np.ndarray]]:  # fmt: skip
    """For one chain, each output's sources and channel table (empty when the chain moves
    more than channels)."""
    inside = set(members)
    inputs: list[relax.Var] = []
    for var in members:
        for read in _vars_in(values[var]):
            if read not in inside and read not in inputs:
                inputs.append(read)
    outputs = [v for v in members if any(r not in inside for r in readers.get(v, ()))]
    shapes = [_shape(v) for v in inputs]
    if not outputs or any(s is None or len(s) not in (4, 5) for s in shapes):
        return {}
    env: dict[relax.Var, Any] = {}
    offset = 0
    for var, shape in zip(inputs, shapes, strict=True):
        size = int(np.prod(shape))
        env[var] = np.arange(offset, offset + size, dtype=np.int64).reshape(shape)
        offset += size
    try:
        for var in members:
            env[var] = _evaluate(kinds[var], values[var], env)
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        logger.debug("channel chain not evaluated: %s", err)
        return {}
    out: dict[relax.Var, relax.Expr] = {}
    for var in outputs:
        labels = env[var]
        if not isinstance(labels, np.ndarray) or labels.ndim not in (4, 5) or _shape(var) is None:
            return {}
        table = _channel_tables(labels, inputs, shapes)
        if table is None:
            return {}
        # Only the inputs this output reads (the others may be bound after it), renumbered.
        used = sorted({int(k) for k in table[:, 0] if k > 0})
        renumber = np.zeros(len(inputs) + 1, dtype=np.int32)
        renumber[used] = np.arange(1, len(used) + 1)
        table = table.copy()
        table[:, 0] = renumber[table[:, 0]]
        out[var] = ([inputs[k - 1] for k in used], table)
    return out


def _channel_tables(labels: np.ndarray, inputs: list, shapes: list) -> np.ndarray | None:
    """Per output channel position (the axes other than batch and the spatial 2 and 3, in
    order): ``[input + 1, first channel coordinate, second]`` (input 0 for a zero), or None
    where an element changes its batch or spatial position or a channel mixes sources."""
    starts = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
    out_idx = np.indices(labels.shape)
    entry = np.zeros((*labels.shape, 3), dtype=np.int64)
    for k, shape in enumerate(shapes):
        mask = (labels >= starts[k]) & (labels < starts[k + 1])
        if not mask.any():
            continue
        coords = np.unravel_index(labels[mask] - starts[k], shape)
        if any((coords[a] != out_idx[a][mask]).any() for a in (0, 2, 3)):
            return None  # moves across batch or space: not a channel move
        chan = [coords[a] for a in range(len(shape)) if a not in (0, 2, 3)]
        entry[mask] = np.stack([np.full_like(chan[0], k + 1), chan[0], chan[1] if len(chan) > 1 else 0 * chan[0]], 1)
    chan_axes = [a for a in range(labels.ndim) if a not in (0, 2, 3)]
    extents = [labels.shape[a] for a in chan_axes]
    flat = np.ravel_multi_index([out_idx[a] for a in chan_axes], extents)
    table = np.zeros((int(np.prod(extents)), 3), dtype=np.int64)
    table[flat.reshape(-1)] = entry.reshape(-1, 3)
    if not (table[flat] == entry).all():
        return None  # one output channel reads several channels
    return table.astype(np.int32)


def _gather(bb: relax.BlockBuilder, var: relax.Var, sources: list[relax.Expr], table: np.ndarray) -> relax.Expr:
    """The call that computes ``var`` from ``sources`` by ``table`` (see :func:`_channel_tables`)."""
    out_shape = _shape(var)
    assert out_shape is not None
    dtype = str(var.ty.dtype)
    chan_axes = [a for a in range(len(out_shape)) if a not in (0, 2, 3)]
    chan_extents = [out_shape[a] for a in chan_axes]
    ranks = [len(_shape(x) or ()) for x in sources]

    def compute(tab: te.Tensor, *srcs: te.Tensor) -> te.Tensor:
        def element(*idx: Any) -> Any:
            key = idx[chan_axes[0]]
            for a, extent in zip(chan_axes[1:], chan_extents[1:], strict=True):
                key = key * extent + idx[a]
            src = tab[key, 0]
            value = tvm.tirx.const(0, dtype)
            for k in range(len(srcs) - 1, -1, -1):
                # Clamped: a tuning measurement runs the function on random tables.
                c0 = tvm.tirx.max(tvm.tirx.min(tab[key, 1], srcs[k].shape[1] - 1), 0)
                at = [idx[0], c0, idx[2], idx[3]]
                if ranks[k] == 5:
                    at.append(tvm.tirx.max(tvm.tirx.min(tab[key, 2], srcs[k].shape[4] - 1), 0))
                value = tvm.tirx.if_then_else(src == k + 1, srcs[k][tuple(at)], value)
            return value

        return te.compute(out_shape, element, name="channel_gather")

    return bb.call_te(compute, relax.const(table, "int32"), *sources, primfunc_name_hint="channel_gather")


@relax.expr_functor.mutator
class _Gather(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, plans: dict[relax.Var, tuple[list[relax.Var], np.ndarray]]) -> None:
        super().__init__(mod)
        self.plans = plans

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        plan = self.plans.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        sources, table = plan
        gathered = _gather(self.builder_, binding.var, [self.visit_expr(v) for v in sources], table)
        self.set_var_remap(binding.var, self.builder_.emit(gathered))


def _substitute(mod: tvm.IRModule, plans: dict) -> tvm.IRModule:
    mutator = _Gather(mod, plans)
    mutator.builder_.update_func(mod.get_global_var("main"), mutator.visit_expr(mod["main"]))
    return relax.transform.DeadCodeElimination(["main"])(mutator.builder_.get())
