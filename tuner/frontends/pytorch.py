"""PyTorch programs through ``torch.export`` and TVM's Relax importer."""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from typing import Any

from tuner.errors import UnknownModelError, install_hint
from tuner.frontends.model import ModelSpec

logger = logging.getLogger(__name__)


def load_torch_factory(target: str, *, batch_size: int = 1, **options: int) -> ModelSpec:
    """Load ``package.module:factory`` and export it with ``torch.export``.

    The factory returns ``(module, example_inputs)`` where ``example_inputs`` is a tuple of
    tensors. If it takes a ``batch_size`` keyword, ``batch_size`` is passed; so are
    ``options`` (``seq_len``, ``image_size``) that its signature names.

    Raises:
        UnknownModelError: torch is missing, the factory cannot be imported, or export fails.
        UserInputError: an option in ``options`` that the factory does not take.
    """
    from tuner.errors import UserInputError

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UnknownModelError(
            f"--model {target!r}: expected package.module:factory for a PyTorch program"
        )
    try:
        import torch  # noqa: F401
    except ImportError as err:
        raise UnknownModelError(
            f"--model {target} is a PyTorch program but torch is not installed: "
            f"{install_hint('torch')}"
        ) from err
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise UnknownModelError(f"cannot import {attr!r} from {module_name!r}: {err}") from err

    accepted = inspect.signature(factory).parameters
    kwargs: dict[str, int] = {}
    if "batch_size" in accepted:
        kwargs["batch_size"] = batch_size
    for key, value in options.items():
        if key not in accepted:
            raise UserInputError(f"--{key.replace('_', '-')} does not apply to {target}: its factory takes no {key}")
        kwargs[key] = value
    result = factory(**kwargs)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UnknownModelError(f"{target} must return (torch.nn.Module, example_inputs)")
    module, example = result
    if not isinstance(example, tuple):
        example = (example,)
    return export_module(module, example, attr, source=target)


def export_module(module: Any, example: tuple[Any, ...], name: str, *, source: str | None = None) -> ModelSpec:
    """``module`` (in eval mode) exported with ``torch.export`` on ``example`` and imported by
    TVM's ``from_exported_program``, weights embedded as constants.

    The spec keeps ``module`` (:attr:`ModelSpec.torch_module`) for whoever runs the same
    network in PyTorch.

    Raises:
        UnknownModelError: ``torch.export`` or TVM's importer failed; one line names the cause
            and points to the ONNX path (``torch.onnx.export``, then ``--model file.onnx``).
    """
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    source = source or name
    module = module.eval()
    stage = "torch.export"
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.13's own pytree code trips its LeafSpec deprecation on every export: noise
            # on the user's terminal that says nothing about their model.
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            exported = torch.export.export(module, example)
            stage = "TVM's PyTorch importer"
            mod = from_exported_program(exported, keep_params_as_input=False)
    except Exception as err:  # export and import raise many error types
        raise UnknownModelError(
            f"{stage} cannot take {source} ({type(err).__name__}: {first_line(err)}); "
            f"export it with torch.onnx.export and pass --model {name}.onnx instead"
        ) from err
    count = sum(p.numel() for p in module.parameters())
    logger.info("imported %s through torch.export (%d parameters)", source, count)
    return ModelSpec(name=name, mod=mod, num_parameters=count, torch_module=module)


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first non-empty line of ``err``'s message, at most ``limit`` characters (torch's and
    TVM's messages run to pages of graph dumps)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."
