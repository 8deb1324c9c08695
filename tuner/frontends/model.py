"""The model every frontend produces: a Relax IRModule plus the values of its weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from tuner.graph.dead_taps import prune_dead_taps
from tuner.graph.fold import fold_constants


@dataclass(frozen=True)
class InputInfo:
    """One argument of a model's ``main`` function."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    # ``[lo, hi)``: the values an input may hold where it indexes a table (index_bounds).
    bounds: tuple[int, int] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model ready for task extraction and compilation.

    ``mod["main"]`` takes the data inputs first, then one argument per entry of ``params``
    (in that order). ``params`` holds concrete weight values (random but well-scaled for the
    built-in zoo; tuning needs shapes, not trained weights). Frontends whose importer embeds
    weights as constants (ONNX, PyTorch) leave ``params`` empty.
    """

    name: str
    mod: tvm.IRModule
    params: dict[str, np.ndarray] = field(default_factory=dict)
    # Parameter count as a framework counts it (trainable weights, not running statistics).
    num_parameters: int | None = None
    # The same network as a ``torch.nn.Module`` in eval mode, for models that came from PyTorch
    # (a factory, torchvision:, timm:, hf:), so a peer can run or export it without building it
    # again. Not compared, and not pickled (``__getstate__``): a spec shipped to a worker need
    # not carry a second copy of the weights, nor need torch there to unpickle.
    torch_module: Any = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # The class attribute (None) stands in for the dropped module after unpickling.
        return {k: v for k, v in self.__dict__.items() if k != "torch_module"}

    @property
    def inputs(self) -> list[InputInfo]:
        """The data inputs of ``main`` (the arguments not given by ``params``)."""
        args = list(self.mod["main"].params)
        data = args[: len(args) - len(self.params)]
        bounds = index_bounds(self.mod)
        return [_input_info(v, bounds.get(v.name)) for v in data]

    def bound(self) -> tvm.IRModule:
        """The module as it is tuned and deployed: every take in ``clip`` mode (:func:`clip_takes`),
        ``params`` bound as constants, batch norm folded into the preceding conv, the
        remaining training-mode ops decomposed for inference, and dilated convs cut to the
        kernel taps that read data (:mod:`tuner.graph.dead_taps`).

        A batch norm whose conv weight and statistics are constants (the zoo's after binding,
        ONNX's and PyTorch's as imported) becomes a scaled weight and a bias add, so the conv
        task carries one add instead of a subtract/divide/multiply/add epilogue. Decomposing
        the rest before fusion lets it fuse into its producer and keeps float16 batch norm in
        float16, as TVM's own ``static_shape_tuning_pipeline`` does.
        """
        mod = clip_takes(self.mod)
        if self.params:
            tensors = {k: tvm.runtime.tensor(v) for k, v in self.params.items()}
            mod = relax.transform.BindParams("main", tensors)(mod)
        # FoldBatchnormToConv2D needs the weights as constants (ONNX files may compute them,
        # e.g. ConstantOfShape) and the batch_norm op itself (before decomposing). Weight
        # arithmetic is folded in numpy first (tuner.graph.fold): TVM's FoldConstant builds every
        # constant call with LLVM, ~320 builds on ResNet-50; it only folds what numpy left.
        mod = relax.transform.FoldConstant()(fold_constants(mod))
        mod = tvm.transform.Sequential([
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
        ])(mod)  # fmt: skip
        # The scaled weights and biases, computed once here, not in every build.
        return prune_dead_taps(relax.transform.FoldConstant()(fold_constants(mod)))

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Deterministic random data inputs (floats in [-1, 1), ints in [0, 100), or below the
        size of the table an input indexes where that is smaller)."""
        rng = np.random.default_rng(seed)
        out = []
        for info in self.inputs:
            if np.dtype(info.dtype).kind in "iu":
                high = min(100, info.bounds[1]) if info.bounds else 100
                out.append(rng.integers(0, high, size=info.shape).astype(info.dtype))
            else:
                out.append(rng.uniform(-1, 1, size=info.shape).astype(info.dtype))
        return out


def _input_info(var: relax.Var, bounds: tuple[int, int] | None = None) -> InputInfo:
    # TVM 0.27 types Relax vars with ``ty`` (a TensorType); struct_info is gone.
    ty = var.ty
    shape = tuple(int(d) for d in ty.shape.values)
    return InputInfo(name=var.name, shape=shape, dtype=str(ty.dtype), bounds=bounds)


# Ops an index passes through unchanged in value on its way from an input to a take.
_SAME_VALUES = ("relax.reshape", "relax.astype", "relax.expand_dims", "relax.squeeze", "relax.flatten",
                "relax.permute_dims")  # fmt: skip


def index_bounds(mod: tvm.IRModule) -> dict[str, tuple[int, int]]:
    """The values each input of ``main`` that indexes a table (``relax.take``) may hold: ``[lo, hi)``.

    A take in ``fast`` mode reads outside the table for an index out of range (BERT's token
    id 30522 crashed ``nightshift run`` with a segfault), one in ``clip`` mode
    (:func:`clip_takes`, as deployed) silently reads the nearest entry, so the runners check
    their inputs against these bounds. ``hi`` is the table's extent; ``lo`` is ``-hi``
    where the index first goes through the ``where(i < 0, i + n, i)`` by which the ONNX
    frontend wraps negative indices, else 0. An input that reaches a take through other
    arithmetic is not bounded.
    """
    main = mod["main"]
    params = set(main.params)
    values: dict = {}
    body = main.body
    for block in getattr(body, "blocks", ()):
        for binding in block.bindings:
            values[binding.var] = binding.value
    bounds: dict[str, tuple[int, int]] = {}
    for value in values.values():
        if not _is_call(value, ("relax.take",)) or str(value.attrs.mode) not in ("fast", "clip"):
            continue
        extent = _extent(value.args[0], value.attrs.axis)
        index, lo = value.args[1], 0
        while extent is not None and index not in params and index in values:
            source = values[index]
            if _is_call(source, _SAME_VALUES):
                index = source.args[0]
            elif _is_call(source, ("relax.where",)):
                index, lo = source.args[2], -extent
            else:
                break
        if extent is not None and index in params:
            old_lo, old_hi = bounds.get(index.name, (lo, extent))
            bounds[index.name] = (max(old_lo, lo), min(old_hi, extent))
    return bounds


def clip_takes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``relax.take`` in ``clip`` mode instead of ``fast``.

    The deployed library then never reads outside a table, whoever calls it: ``fast`` reads
    past it for an index out of range (a segfault, or another tensor's memory). Nightshift's
    own runners refuse such an index first (:func:`index_bounds`, with a clear error);
    a program that calls the library through TVM's runtime gets the nearest entry. The cost
    is a min and a max per index (128 for BERT-base), against the table's rows it copies.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def clipped(call: relax.Call, _matches: dict) -> relax.Expr:
        if str(call.attrs.mode) != "fast":
            return call
        axis = call.attrs.axis
        return relax.op.take(call.args[0], call.args[1], None if axis is None else int(axis), mode="clip")

    funcs = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            func = rewrite_call(is_op("relax.take")(wildcard(), wildcard()), clipped, func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _is_call(expr: relax.Expr, ops: tuple[str, ...]) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) in ops


def _extent(table: relax.Expr, axis) -> int | None:
    """The number of entries a take over ``axis`` of ``table`` can index (None: not static)."""
    try:
        dims = [int(d) for d in table.ty.shape.values]
    except (AttributeError, TypeError, ValueError):  # no static shape
        return None
    if axis is None:
        return int(np.prod(dims))
    return dims[int(axis)]
