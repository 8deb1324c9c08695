"""int8 for a float model: quantized first with onnxruntime's static quantization.

``--precision int8`` takes a QDQ model (:mod:`tuner.precision.qdq`). Given a float one (a zoo
name or an fp32 ONNX file), the CLI quantizes it first, as a user would with
``onnxruntime.quantization.quantize_static``: the QDQ format, per-channel symmetric int8
weights, uint8 activations calibrated (min/max) on ``N`` random inputs with fixed seeds;
7-bit weights (``reduce_range``) where the CPU's int8 dot product adds pairs of products in
int16 (AVX2: :func:`tuner.precision.int8_weight_bits`).
``--quantize-ops`` names the ONNX operators it quantizes (``op_types_to_quantize``). The
default, Conv, Gemm and MatMul (:data:`DEFAULT_OPS`), leaves LayerNorm, the residual adds and
the embeddings in fp32: BERT-base's top-1 agreement with fp32 is 90.6% that way against
87.7% with ``all`` (every operator onnxruntime can quantize), and TVM runs it faster; for
ResNet-50 both recipes measured alike (benchmarks/int8_recipes.py, benchmarks/README.md).
The file is cached under the fp32 model's content hash (an ONNX file's bytes, a zoo model's
structure and weights) and the recipe: the same model, ``N`` and operators give the same
file, so its tasks keep their workload keys between ``tune``, ``compile`` and ``bench``.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from tuner.errors import UserInputError
from tuner.host import cache_root

logger = logging.getLogger(__name__)

DEFAULT_CALIBRATION = 32
#: The operators ``--precision int8`` quantizes in a float model unless ``--quantize-ops`` says.
DEFAULT_OPS: tuple[str, ...] = ("Conv", "Gemm", "MatMul")
# Seeds of the calibration inputs: ModelSpec.random_inputs(seed=_SEED + i).
_SEED = 100


def has_qdq(mod: tvm.IRModule) -> bool:
    """Whether a bound module has a ``dequantize`` (it came from a quantized model)."""
    found = False

    def visit(expr: relax.Expr) -> None:
        nonlocal found
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.dequantize":
            found = True

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return found


def cache_dir() -> Path:
    """Where quantized models are kept (``$NIGHTSHIFT_CACHE`` or ``~/.cache/nightshift``)."""
    return cache_root() / "quantized"


def parse_ops(text: str | None) -> tuple[str, ...] | None:
    """``--quantize-ops``: comma-separated ONNX operator types (sorted); :data:`DEFAULT_OPS`
    for None or an empty string; None (every one onnxruntime quantizes) for ``all``."""
    if not text or not text.strip():
        return DEFAULT_OPS
    if text.strip().lower() == "all":
        return None
    ops = tuple(sorted({t.strip() for t in text.split(",") if t.strip()}))
    bad = [t for t in ops if not t.isidentifier() or not t[0].isupper()]
    if bad:
        raise UserInputError(f"--quantize-ops takes ONNX operator types such as MatMul,Conv (or all), "
                             f"not {', '.join(bad)}")  # fmt: skip
    return ops


def quantize_onnx(fp32_onnx: Path, out: Path, spec, num_inputs: int, *,
                  op_types: tuple[str, ...] | None = None, weight_bits: int = 8) -> Path:  # fmt: skip
    """``fp32_onnx`` quantized by ``quantize_static`` (QDQ, per-channel int8 weights, uint8
    activations) calibrated on ``num_inputs`` random inputs of ``spec``; written to ``out``.
    ``op_types``: the ONNX operators to quantize (None: every one onnxruntime can);
    ``weight_bits`` 7: ``reduce_range`` (:func:`tuner.precision.int8_weight_bits`)."""
    if num_inputs < 1:
        raise UserInputError(f"--calibration must be a positive count, got {num_inputs}")
    try:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    except ImportError as err:
        from tuner.bench import BENCH_EXTRA

        raise UserInputError(f"--precision int8 on a float model quantizes it with onnxruntime first: "
                             f"{BENCH_EXTRA} ({err})") from err  # fmt: skip
    names = [i.name for i in spec.inputs]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._left = iter(range(num_inputs))

        def get_next(self) -> dict[str, np.ndarray] | None:
            i = next(self._left, None)
            return None if i is None else dict(zip(names, spec.random_inputs(seed=_SEED + i), strict=True))

    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its final name, then renamed: a killed run leaves no half file to reuse.
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        quantize_static(str(fp32_onnx), str(part), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=list(op_types) if op_types else None,
                        reduce_range=weight_bits == 7)  # fmt: skip
        part.replace(out)
    return out


def quantized_model(spec, source: str, num_inputs: int = DEFAULT_CALIBRATION, *,
                    op_types: tuple[str, ...] | None = DEFAULT_OPS, directory: Path | None = None,
                    weight_bits: int | None = None) -> Path:  # fmt: skip
    """The QDQ ONNX file of the float model ``spec`` (``--model source``), made once and cached.
    ``op_types``: the ONNX operators to quantize (None: every one onnxruntime can);
    ``weight_bits``: 8, or 7 (``reduce_range``); None: what this machine's CPU runs exactly
    (:func:`tuner.precision.int8_weight_bits`).

    An ONNX file is keyed by its bytes; a zoo model by what its export is made of
    (``_zoo_digest``), so a cached zoo model is found without exporting it again.

    Raises:
        UserInputError: the model cannot be exported to ONNX here, or onnxruntime is missing.
    """
    from tuner.bench import peer_model

    if weight_bits is None:
        from tuner.device import parse_device
        from tuner.precision import int8_weight_bits

        weight_bits = int8_weight_bits(parse_device("cpu").target)
    if weight_bits not in (7, 8):
        raise UserInputError(f"int8 weights are quantized to 7 or 8 bits, not {weight_bits}")
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)

    def cached(key: str) -> Path:
        # The file's name is the model's name in tables and job names: resnet50-int8 for the
        # default recipe, bert-base-int8-matmul for --quantize-ops MatMul, resnet50-int8-all
        # (so a job of another recipe is not the default's), resnet50-int8-w7 for 7-bit
        # weights. The folder always names the recipe: a file cached before the default
        # changed (every operator) is not reused.
        ops = "-all" if op_types is None else "".join(f"-{op.lower()}" for op in op_types)
        bits = "" if weight_bits == 8 else f"-w{weight_bits}"
        recipe = ops + bits
        suffix = ("" if op_types == DEFAULT_OPS else ops) + bits
        path = directory / f"{key}-cal{num_inputs}{recipe}" / f"{spec.name}-int8{suffix}.onnx"
        if path.exists():
            logger.info("int8: reusing %s", path)
        return path

    zoo = _zoo_digest(spec, source)
    if zoo is not None and (out := cached(f"zoo-{zoo}")).exists():
        return out
    with tempfile.TemporaryDirectory(prefix="nightshift-export-") as tmp:
        fp32 = peer_model(spec, source, Path(tmp))
        if fp32.onnx_path is None:
            raise UserInputError(f"--precision int8 needs {spec.name} as ONNX to quantize it: {fp32.onnx_reason}")
        if zoo is None and (out := cached(hashlib.sha256(fp32.onnx_path.read_bytes()).hexdigest()[:16])).exists():
            return out
        logger.info("int8: quantizing %s on %d random inputs", spec.name, num_inputs)
        return quantize_onnx(fp32.onnx_path, out, spec, num_inputs, op_types=op_types, weight_bits=weight_bits)


def _zoo_digest(spec, source: str) -> str | None:
    """For a zoo model, a digest of what its ONNX export is made of: the network's structure,
    its weights and the exporter's version (for ResNet-50 on the project's 2-core machine:
    0.06 s, against 1.2 s to export it again); None for any other source."""
    if source.lower().endswith(".onnx") or ":" in source:
        return None
    try:
        import torch
    except ImportError:
        return None  # peer_model says what is missing
    h = hashlib.sha256(f"{spec.name}|{tvm_ffi.structural_hash(spec.mod)}|torch {torch.__version__}".encode())
    for key in sorted(spec.params):
        value = np.ascontiguousarray(spec.params[key])
        h.update(f"|{key}:{value.dtype}:{value.shape}|".encode())
        h.update(memoryview(value).cast("B"))
    return h.hexdigest()[:16]
