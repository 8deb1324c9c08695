"""Model frontends: a built-in zoo name, an ONNX file, a PyTorch factory or a model of the
PyTorch ecosystem (``torchvision:``, ``timm:``, ``hf:``) -> ModelSpec."""

from __future__ import annotations

import inspect

from tuner.frontends.model import InputInfo, ModelSpec

__all__ = ["InputInfo", "ModelSpec", "load_model"]


def load_model(model: str, *, batch_size: int = 1, dtype: str = "float32", seq_len: int | None = None,
               image_size: int | None = None) -> ModelSpec:  # fmt: skip
    """Load a model from any supported source.

    Args:
        model: a zoo name (``resnet50``), a path ending in ``.onnx``, ``torchvision:NAME``,
            ``timm:NAME``, ``hf:NAME`` (an architecture built with random weights, nothing
            downloaded), or ``package.module:factory`` naming a function that returns a
            ``torch.nn.Module`` and example inputs.
        batch_size: batch dimension for zoo models, ecosystem models and PyTorch factories that
            accept it.
        dtype: element type of zoo models' weights and activations.
        seq_len: tokens per sequence of a text model (``hf:``, ``bert-base``, a factory that
            takes ``seq_len``); None: the model's default.
        image_size: height and width of an image model's input; None: the model's default.

    The weights are numpy arrays on their way into TVM, so numpy's huge-page advice is
    turned off for the process first (:func:`tuner.memory.small_pages` says why).

    Raises:
        UnknownModelError: the model cannot be found or imported; the message says why.
        UserInputError: an option that does not apply to the model.
    """
    from tuner.errors import UserInputError
    from tuner.memory import small_pages

    small_pages()

    if batch_size <= 0:
        raise UserInputError(f"--batch-size must be a positive integer, got {batch_size}")
    for option, value in (("seq-len", seq_len), ("image-size", image_size)):
        if value is not None and value <= 0:
            raise UserInputError(f"--{option} must be a positive integer, got {value}")
    # Only the options given go on: each source has its own defaults.
    options = {k: v for k, v in (("seq_len", seq_len), ("image_size", image_size)) if v is not None}
    if model.lower().endswith(".onnx"):
        if options:
            given = ", ".join(f"--{k.replace('_', '-')}" for k in options)
            raise UserInputError(f"{given} does not apply to an ONNX file: its input shapes are fixed in the file")
        from tuner.frontends.onnx import load_onnx

        return load_onnx(model)
    from tuner.frontends.ecosystem import is_ecosystem_model

    if is_ecosystem_model(model):
        from tuner.frontends.ecosystem import load_ecosystem

        return load_ecosystem(model, batch_size=batch_size, **options)
    if ":" in model:
        from tuner.frontends.pytorch import load_torch_factory

        return load_torch_factory(model, batch_size=batch_size, **options)
    from tuner.frontends.zoo import ZOO, build_zoo_model

    builder = ZOO.get(model)
    for key in options:
        if builder is not None and key not in inspect.signature(builder).parameters:
            raise UserInputError(f"--{key.replace('_', '-')} does not apply to zoo model {model}")
    return build_zoo_model(model, batch_size=batch_size, dtype=dtype, **options)
