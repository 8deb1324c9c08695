"""The model every frontend produces: a Relax IRModule plus the values of its weights."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tuner.fold import fold_constants


@dataclass(frozen=True)
class InputInfo:
    """One argument of a model's ``main`` function."""

    name: str
    shape: tuple[int, ...]
    dtype: str


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

    @property
    def inputs(self) -> list[InputInfo]:
        """The data inputs of ``main`` (the arguments not given by ``params``)."""
        args = list(self.mod["main"].params)
        data = args[: len(args) - len(self.params)]
        return [_input_info(v) for v in data]

    def bound(self) -> tvm.IRModule:
        """The module as it is tuned and deployed: ``params`` bound as constants, batch norm
        folded into the preceding conv, and the remaining training-mode ops decomposed for
        inference.

        A batch norm whose conv weight and statistics are constants (the zoo's after binding,
        ONNX's and PyTorch's as imported) becomes a scaled weight and a bias add, so the conv
        task carries one add instead of a subtract/divide/multiply/add epilogue. Decomposing
        the rest before fusion lets it fuse into its producer and keeps float16 batch norm in
        float16, as TVM's own ``static_shape_tuning_pipeline`` does.
        """
        mod = self.mod
        if self.params:
            tensors = {k: tvm.runtime.tensor(v) for k, v in self.params.items()}
            mod = relax.transform.BindParams("main", tensors)(mod)
        # FoldBatchnormToConv2D needs the weights as constants (ONNX files may compute them,
        # e.g. ConstantOfShape) and the batch_norm op itself (before decomposing). Weight
        # arithmetic is folded in numpy first (tuner.fold): TVM's FoldConstant builds every
        # constant call with LLVM, ~320 builds on ResNet-50; it only folds what numpy left.
        mod = relax.transform.FoldConstant()(fold_constants(mod))
        mod = tvm.transform.Sequential([
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
        ])(mod)  # fmt: skip
        # The scaled weights and biases, computed once here, not in every build.
        return relax.transform.FoldConstant()(fold_constants(mod))

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Deterministic random data inputs (floats in [-1, 1), ints in [0, 100))."""
        rng = np.random.default_rng(seed)
        out = []
        for info in self.inputs:
            if np.dtype(info.dtype).kind in "iu":
                out.append(rng.integers(0, 100, size=info.shape).astype(info.dtype))
            else:
                out.append(rng.uniform(-1, 1, size=info.shape).astype(info.dtype))
        return out


def _input_info(var: relax.Var) -> InputInfo:
    # TVM 0.27 types Relax vars with ``ty`` (a TensorType); struct_info is gone.
    ty = var.ty
    shape = tuple(int(d) for d in ty.shape.values)
    return InputInfo(name=var.name, shape=shape, dtype=str(ty.dtype))
