"""Models from the PyTorch ecosystem by name: ``torchvision:NAME``, ``timm:NAME``, ``hf:NAME``.

Each is built from its library's own code with seeded random weights (tuning needs shapes,
not trained weights, and no hub is reachable), its batch norms' statistics measured on a
seeded random batch (:func:`_calibrated`), put in eval mode and imported like any
PyTorch program (:func:`tuner.frontends.pytorch.export_module`). Nothing is downloaded:
``hf:`` builds an architecture from its config class's defaults, never ``from_pretrained``.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import logging
import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any

from tuner.errors import UnknownModelError, UserInputError, install_hint
from tuner.frontends.model import ModelSpec

logger = logging.getLogger(__name__)

#: ``--model`` prefixes this module serves, and the extra that installs each one's library.
PREFIXES: dict[str, str] = {"torchvision": "vision", "timm": "vision", "hf": "hf"}

#: Sequence length of ``hf:`` models when ``--seq-len`` is not given.
DEFAULT_SEQ_LEN = 128

#: torchvision model families whose input is not one batch of images.
_TORCHVISION_UNSUPPORTED = ("detection", "video", "optical_flow")

# The operator library that lets torchvision import where its C++ extension cannot load
# (_torchvision_ops); kept alive here, since a dropped torch.library.Library unregisters them.
_torchvision_ops: Any = None


def is_ecosystem_model(model: str) -> bool:
    """Whether ``--model`` names a model by one of :data:`PREFIXES` (``torchvision:resnet18``)."""
    prefix, sep, _ = model.partition(":")
    return bool(sep) and prefix in PREFIXES


def load_ecosystem(model: str, *, batch_size: int = 1, seq_len: int | None = None, image_size: int | None = None,
                   hf_config: dict[str, Any] | None = None) -> ModelSpec:  # fmt: skip
    """Build and import ``torchvision:NAME``, ``timm:NAME`` or ``hf:NAME``.

    Args:
        model: the prefixed name.
        batch_size: the input's batch dimension.
        seq_len: tokens per sequence of an ``hf:`` model (default :data:`DEFAULT_SEQ_LEN`).
        image_size: height and width of a ``torchvision:``/``timm:`` model's input (default: the
            size its weights were trained at, from the library's own metadata).
        hf_config: attributes set on an ``hf:`` model's config before building it (a smaller
            ``num_hidden_layers``, for instance).

    Raises:
        UnknownModelError: the library is missing, the name is unknown, or the model cannot be
            exported or imported (one line says why and what to try).
        UserInputError: an option that does not apply to the model, or a sequence longer than
            the model's positions.
    """
    prefix, _, name = model.partition(":")
    if prefix not in PREFIXES:
        raise UnknownModelError(f"--model {model}: expected one of {', '.join(p + ':NAME' for p in PREFIXES)}")
    if not name:
        raise UnknownModelError(f"--model {model}: name a model after '{prefix}:' ({_EXAMPLES[prefix]})")
    if prefix == "hf":
        if image_size is not None:
            raise UserInputError(f"--image-size does not apply to {model} (a text model); use --seq-len")
        return _hf(name, batch_size, DEFAULT_SEQ_LEN if seq_len is None else seq_len, hf_config or {})
    if seq_len is not None:
        raise UserInputError(f"--seq-len does not apply to {model} (an image model); use --image-size")
    if image_size is not None and image_size < 1:
        raise UserInputError(f"--image-size must be a positive integer, got {image_size}")
    if prefix == "torchvision":
        return _torchvision(name, batch_size, image_size)
    return _timm(name, batch_size, image_size)


_EXAMPLES = {"torchvision": "torchvision:resnet50", "timm": "timm:resnet18", "hf": "hf:bert-base-uncased"}


def _import(prefix: str, module: str) -> Any:
    """``module`` imported (after torch and, where installed, torchvision), or the extra to install."""
    try:
        import torch  # noqa: F401

        # timm and transformers import torchvision themselves where it is installed.
        if module == "torchvision" or importlib.util.find_spec("torchvision") is not None:
            _import_torchvision()
        return __import__(module)
    except ImportError as err:
        raise UnknownModelError(f"--model {prefix}:NAME needs {err.name or module}, which is not installed: "
                                f"{install_hint(PREFIXES[prefix])}") from err  # fmt: skip


def _import_torchvision() -> Any:
    """``import torchvision``, also where its C++ extension does not load.

    The registry's torchvision 0.28.0 wheel is built against the CUDA build of torch 2.13.0;
    beside the CPU build its ``_C`` extension cannot load (no ``libtorch_cuda``), which
    torchvision tolerates, except that it then registers a fake kernel for ``torchvision::nms``
    unconditionally and fails at import. Declaring the schemas of ``nms`` and ``qnms`` lets it
    import; only detection models call them (and those are refused here), so no kernel is needed.
    """
    global _torchvision_ops
    try:
        import torchvision
    except RuntimeError as err:
        if "torchvision::nms" not in str(err):
            raise
        import torch

        for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[key]  # the half-imported package, imported again below
        _torchvision_ops = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            _torchvision_ops.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        logger.info("torchvision's C++ operators do not load beside torch %s; imported without them "
                    "(classification and segmentation models do not use them)", torch.__version__)  # fmt: skip
        import torchvision
    return torchvision


def model_names(prefix: str) -> list[str]:
    """The names ``prefix:NAME`` accepts: torchvision's models, timm's architectures, or the
    ``model_type`` of every transformers config (``hf:``).

    The way to list them that an error message gives: it imports torchvision as the frontend
    does, where a plain ``import torchvision`` fails (:func:`_import_torchvision`).

    Raises:
        UnknownModelError: ``prefix`` is not one of :data:`PREFIXES`, or its library is missing.
    """
    if prefix not in PREFIXES:
        raise UnknownModelError(f"{prefix!r} is not one of {', '.join(PREFIXES)}")
    if prefix == "torchvision":
        _import("torchvision", "torchvision")
        from torchvision import models

        return sorted(models.list_models())
    if prefix == "timm":
        return sorted(_import("timm", "timm").list_models())
    return sorted(_import("hf", "transformers").CONFIG_MAPPING.keys())


def _unknown(prefix: str, name: str, known: Iterable[str], note: str = "") -> UnknownModelError:
    """One line: the name is unknown, the closest known ones, and how to list them all."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    how = f"python -c \"from tuner.frontends.ecosystem import model_names; print(model_names('{prefix}'))\""
    return UnknownModelError(f"unknown {prefix} model {name!r}; {hint}list the valid names with {how}{note}")


def _seeded(build: Any) -> Any:
    """``build()`` with torch's RNG seeded to 0 (the same random weights every run), leaving the
    caller's RNG as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


def _calibrated(module: Any, input_shape: tuple[int, ...]) -> Any:
    """``module`` with every batch norm's running mean and variance measured on one seeded
    random batch of two ``input_shape`` samples, as training would leave them.

    A freshly built model's statistics (mean 0, variance 1) do not normalize what its random
    weights produce: activations shrink layer by layer until the output no longer depends on
    the input (GoogLeNet's and DeepLab-v3's do not, to float precision), and then an output
    check against another runtime proves nothing. Measured statistics keep every layer's
    output at unit scale, as in a trained model.
    """
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return module
    momenta = [m.momentum for m in norms]
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: after one batch, that batch's statistics
        module.train()
        module(torch.randn(2, *input_shape[1:]))  # two samples: a norm after global pooling needs them
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    return module.eval()


def _torchvision(name: str, batch_size: int, image_size: int | None) -> ModelSpec:
    _import("torchvision", "torchvision")
    import torch
    from torchvision import models

    if name not in models.list_models():
        raise _unknown("torchvision", name, models.list_models())
    for family in _TORCHVISION_UNSUPPORTED:
        if name in models.list_models(module=getattr(models, family)):
            raise UnknownModelError(f"torchvision:{name} is a {family.replace('_', ' ')} model; only classification "
                                    "and segmentation models (images in, one tensor out) import")  # fmt: skip
    # Every weights argument off: segmentation models would fetch an ImageNet backbone by default.
    builder = models.get_model_builder(name)
    no_weights = {k: None for k in inspect.signature(builder).parameters if k.startswith("weights")}
    with warnings.catch_warnings():
        # inception_v3 and googlenet warn that their default init will change: not the user's concern.
        warnings.filterwarnings("ignore", category=FutureWarning, module="torchvision")
        module = _seeded(lambda: builder(**no_weights))
    size = image_size or _torchvision_size(models, name, module)
    module = _calibrated(module, (batch_size, 3, size, size))
    if name in models.list_models(module=models.segmentation):
        from tuner.frontends.torch_wrappers import OutputEntry

        module = OutputEntry(module, "out")  # segmentation returns {"out": ..., "aux": ...}
    example = (torch.randn(batch_size, 3, size, size),)
    return _export(module, example, "torchvision", name)


def _torchvision_size(models: Any, name: str, module: Any) -> int:
    """The input size ``name`` was trained at: the model's own ``image_size`` (ViT fixes it),
    else its default weights' evaluation crop (299 for inception_v3) or resize (segmentation),
    else 224."""
    if isinstance(getattr(module, "image_size", None), int):
        return int(module.image_size)
    try:
        transforms = models.get_model_weights(name).DEFAULT.transforms()
    except (ValueError, AttributeError, KeyError):  # a model without published weights
        return 224
    size = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
    return int(size[0]) if size else 224


def _timm(name: str, batch_size: int, image_size: int | None) -> ModelSpec:
    timm = _import("timm", "timm")
    import torch

    # A pretrained tag (resnet18.a1_in1k) names weights, not an architecture.
    if not timm.is_model(name.split(".", 1)[0]):
        raise _unknown("timm", name, timm.list_models())
    module = _seeded(lambda: timm.create_model(name, pretrained=False))
    cfg = getattr(module, "pretrained_cfg", None) or getattr(module, "default_cfg", None) or {}
    channels, height, width = cfg.get("input_size", (3, 224, 224))
    if image_size is not None:
        height = width = image_size
    module = _calibrated(module, (batch_size, channels, height, width))
    example = (torch.randn(batch_size, channels, height, width),)
    return _export(module, example, "timm", name)


def _hf(name: str, batch_size: int, seq_len: int, overrides: dict[str, Any]) -> ModelSpec:
    # Never reach the hub: no weights are wanted, and none could be fetched here anyway.
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = _import("hf", "transformers")
    import torch

    types = list(transformers.CONFIG_MAPPING.keys())
    model_type = _hf_model_type(name, types)
    if model_type is None:
        raise _unknown("hf", name, types, " (a model_type, or one followed by -SIZE as in bert-base-uncased)")
    config = transformers.CONFIG_MAPPING[model_type]()
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise UserInputError(f"hf:{name}: {type(config).__name__} has no attribute {key!r}")
        setattr(config, key, value)
    if getattr(config, "is_encoder_decoder", False):
        raise UnknownModelError(f"hf:{name} is an encoder-decoder model; only encoder or decoder-only text models "
                                "(token ids in, hidden states out) import")  # fmt: skip
    if model_type != name.rsplit("/", 1)[-1].lower():
        logger.warning("hf:%s: built from %s's defaults with random weights; a checkpoint's own sizes are not read "
                       "(no download)", name, type(config).__name__)  # fmt: skip
    if seq_len < 1:
        raise UserInputError(f"--seq-len must be a positive integer, got {seq_len}")
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if isinstance(positions, int) and seq_len > positions:
        raise UserInputError(f"hf:{name} takes at most {positions} tokens, got --seq-len {seq_len}")
    # One tensor out: no key/value cache, a ModelOutput whose last_hidden_state is taken.
    config.use_cache = False
    config.return_dict = True
    try:
        # Eager attention is plain matmul and softmax, which task extraction splits into the
        # same dense and batch-matmul tasks as the zoo's bert-base; SDPA also imports, but as
        # one attention op outside those tasks.
        module = _seeded(lambda: transformers.AutoModel.from_config(config, attn_implementation="eager"))
    except (ValueError, KeyError) as err:  # no AutoModel for this config (a processor-only type...)
        raise UnknownModelError(f"hf:{name}: transformers has no AutoModel for {type(config).__name__} "
                                f"({_first(err)})") from err  # fmt: skip
    accepted = inspect.signature(module.forward).parameters
    if "input_ids" not in accepted:
        raise UnknownModelError(f"hf:{name} does not take token ids ({type(module).__name__}); only text models "
                                "import by hf:, image models by timm: or torchvision:")  # fmt: skip
    with_mask = "attention_mask" in accepted
    vocab = int(getattr(config, "vocab_size", None) or 100)
    ids = torch.randint(0, min(vocab, 100), (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    example = (ids, torch.ones_like(ids)) if with_mask else (ids,)
    from tuner.frontends.torch_wrappers import LastHiddenState

    return _export(LastHiddenState(module), example, "hf", name)


def _hf_model_type(name: str, types: list[str]) -> str | None:
    """The ``model_type`` ``name`` names: itself, or the longest one it starts with followed by
    ``-`` or ``_`` (``distilbert-base-uncased`` -> ``distilbert``, not ``bert``); an
    organisation (``facebook/opt-125m``) is dropped."""
    base = name.rsplit("/", 1)[-1].lower()
    forms = {base, base.replace("-", "_"), base.replace("_", "-")}
    if forms & set(types):
        return next(t for t in types if t in forms)
    matches = [t for t in types for f in forms if f.startswith(t + "-") or f.startswith(t + "_")]
    return max(matches, key=len) if matches else None


def _export(module: Any, example: tuple[Any, ...], prefix: str, name: str) -> ModelSpec:
    from tuner.frontends.pytorch import export_module

    # The spec's name is a file and job name: no colon or slash, and apart from the zoo's.
    return export_module(module, example, f"{prefix}-{name.replace('/', '-')}", source=f"{prefix}:{name}")


def _first(err: BaseException) -> str:
    from tuner.frontends.pytorch import first_line

    return first_line(err)
