"""ONNX files through TVM's Relax ONNX importer."""

from __future__ import annotations

import logging
from pathlib import Path

from tuner.errors import UnknownModelError, install_hint
from tuner.frontends.model import ModelSpec

logger = logging.getLogger(__name__)


def load_onnx(path: str | Path) -> ModelSpec:
    """Import an ONNX model file; weights stay embedded as constants.

    Raises:
        UnknownModelError: the file is missing, unreadable, not ONNX, or TVM cannot import it.
    """
    path = Path(path)
    if not path.is_file():
        raise UnknownModelError(f"ONNX file not found: {path}; check the path passed to --model")
    try:
        import onnx
    except ImportError as err:
        raise UnknownModelError(
            f"reading ONNX files needs the onnx package: {install_hint('onnx')}"
        ) from err
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto)
    except Exception as err:  # onnx raises DecodeError, ValidationError, OSError...
        raise UnknownModelError(
            f"{path} is not a valid ONNX model ({type(err).__name__}: {_first_line(err)}); "
            "re-export it or pass another file"
        ) from err

    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(proto, keep_params_in_input=False)
    except Exception as err:  # the importer raises assorted errors for unsupported ops
        raise UnknownModelError(
            f"TVM cannot import {path} ({type(err).__name__}: {_first_line(err)})"
        ) from err
    logger.info("imported %s (opset %s)", path, [o.version for o in proto.opset_import])
    return ModelSpec(name=path.stem, mod=mod)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else ""
