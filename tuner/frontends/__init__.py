"""Model frontends: a built-in zoo name, an ONNX file or a PyTorch factory -> ModelSpec."""

from __future__ import annotations

from tuner.frontends.model import InputInfo, ModelSpec

__all__ = ["InputInfo", "ModelSpec", "load_model"]


def load_model(model: str, *, batch_size: int = 1, dtype: str = "float32") -> ModelSpec:
    """Load a model from any supported source.

    Args:
        model: a zoo name (``resnet50``), a path ending in ``.onnx``, or
            ``package.module:factory`` naming a function that returns a ``torch.nn.Module``
            and example inputs.
        batch_size: batch dimension for zoo models and PyTorch factories that accept it.
        dtype: element type of zoo models' weights and activations.

    The weights are numpy arrays on their way into TVM, so numpy's huge-page advice is
    turned off for the process first (:func:`tuner.memory.small_pages` says why).

    Raises:
        UnknownModelError: the model cannot be found or imported; the message says why.
    """
    from tuner.errors import UserInputError
    from tuner.memory import small_pages

    small_pages()

    if batch_size <= 0:
        raise UserInputError(f"--batch-size must be a positive integer, got {batch_size}")
    if model.lower().endswith(".onnx"):
        from tuner.frontends.onnx import load_onnx

        return load_onnx(model)
    if ":" in model:
        from tuner.frontends.pytorch import load_torch_factory

        return load_torch_factory(model, batch_size=batch_size)
    from tuner.frontends.zoo import build_zoo_model

    return build_zoo_model(model, batch_size=batch_size, dtype=dtype)
