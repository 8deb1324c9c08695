"""PyTorch programs through ``torch.export`` and TVM's Relax importer."""

from __future__ import annotations

import importlib
import inspect
import logging

from tuner.errors import UnknownModelError, install_hint
from tuner.frontends.model import ModelSpec

logger = logging.getLogger(__name__)


def load_torch_factory(target: str, *, batch_size: int = 1) -> ModelSpec:
    """Load ``package.module:factory`` and export it with ``torch.export``.

    The factory returns ``(module, example_inputs)`` where ``example_inputs`` is a tuple of
    tensors. If it takes a ``batch_size`` keyword, ``batch_size`` is passed.

    Raises:
        UnknownModelError: torch is missing, the factory cannot be imported, or export fails.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UnknownModelError(
            f"--model {target!r}: expected package.module:factory for a PyTorch program"
        )
    try:
        import torch
    except ImportError as err:
        raise UnknownModelError(
            f"--model {target} is a PyTorch program but torch is not installed: "
            f"{install_hint('torch')}"
        ) from err
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise UnknownModelError(f"cannot import {attr!r} from {module_name!r}: {err}") from err

    kwargs = {}
    if "batch_size" in inspect.signature(factory).parameters:
        kwargs["batch_size"] = batch_size
    result = factory(**kwargs)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UnknownModelError(f"{target} must return (torch.nn.Module, example_inputs)")
    module, example = result
    if not isinstance(example, tuple):
        example = (example,)

    from tvm.relax.frontend.torch import from_exported_program

    try:
        with torch.no_grad():
            exported = torch.export.export(module.eval(), example)
        mod = from_exported_program(exported, keep_params_as_input=False)
    except Exception as err:  # export and import raise many error types
        raise UnknownModelError(f"cannot export {target} to TVM: {type(err).__name__}: {err}") from err
    return ModelSpec(name=attr, mod=mod)
