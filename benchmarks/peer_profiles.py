"""Per-operator profiles of the peers, matched to TVM's fused functions by operator shape.

A conv or matmul is named by what does not depend on layout or fusion: its numbers of outputs,
multiply-adds, input elements and weights (the last two tell a stride-2 conv from a stride-1
one of the same output and work). TVM's side reads them off the reduction block of each task's PrimFunc,
the peers' side off the ONNX graph (shape inference). OpenVINO names each executed node after
the ONNX node it came from (``/layer1/layer1.0/conv1/Conv/WithoutBiases``); ONNX Runtime names
a fused NCHWc node after the tensor it writes (``/layer1/layer1.0/Relu_output_0_nchwc``),
which leads back to the conv through the unary ops fused after it. Used by op_profile.py.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Ops that ONNX Runtime and OpenVINO fuse after a conv and that name the fused node's output.
_UNARY = {"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Identity"}


@dataclass(frozen=True)
class HeavyOp:
    """A Conv, Gemm or MatMul node of an ONNX graph."""

    name: str
    label: str  # e.g. "conv 3x3/1 64->64 56x56"
    outputs: int
    macs: int
    inputs: int  # elements of the data input (a matmul's left operand)
    weights: int  # elements of the weight (a matmul's right operand)

    @property
    def size(self) -> tuple[int, int, int, int]:
        return self.outputs, self.macs, self.inputs, self.weights


def reduction_size(mod) -> tuple[int, int, int, int] | None:
    """(outputs, multiply-adds, inputs, weights) of the largest reduction block of ``mod``'s
    ``main``: a conv's or matmul's size in any layout, epilogue excluded (inputs and weights
    count the elements of the arguments its two operands come from); None where nothing
    reduces."""
    from tvm.s_tir import Schedule

    from search_spaces.templates.blocks import iter_kinds, root_blocks

    sch = Schedule(mod)
    direct = _winograd_size(sch, mod)
    if direct is not None:
        return direct
    best = None
    for block in root_blocks(sch):
        kinds = iter_kinds(sch, block)
        if "R" not in kinds:
            continue
        extents = [int(iv.dom.extent) for iv in sch.get(block).iter_vars]
        outputs = math.prod(e for e, k in zip(extents, kinds, strict=True) if k == "S")
        if best is None or math.prod(extents) > best[0][1]:
            best = ((outputs, math.prod(extents)), block)
    if best is None or len(sch.get(best[1]).reads) < 2:
        return None
    reads = sch.get(best[1]).reads
    return (*best[0], *(_source_elements(sch, best[1], r.source) for r in reads[:2]))


def _source_elements(sch, block, buffer) -> int:
    """Elements of the function argument that ``block``'s read of ``buffer`` comes from,
    through the elementwise and padding blocks before it (a residual cast can be a fused
    function's first argument, and a padded copy is larger than the ONNX node's input)."""
    for _ in range(8):  # a few producers at most; a bound, not a search
        producer = next((p for p in sch.get_producers(block)
                         if any(w.source.same_as(buffer) for w in sch.get(p).writes)), None)  # fmt: skip
        if producer is None or not sch.get(producer).reads:
            break
        block, buffer = producer, sch.get(producer).reads[0].source
    return math.prod(int(d) for d in buffer.shape)


def _winograd_size(sch, mod) -> tuple[int, int, int, int] | None:
    """A Winograd conv's size as the direct 3x3 conv it computes (what the peers run), or
    None for another function: its GEMMs' sizes name no ONNX node."""
    try:
        out = sch.get(sch.get_sblock("conv2d_NCHWc_winograd"))
        gemm = sch.get(sch.get_sblock("bgemm"))
    except (RuntimeError, ValueError):  # no such block
        return None
    outputs = math.prod(int(iv.dom.extent) for iv in out.iter_vars)
    # (eps, nu, oc chunks, tiles, oc block, reduction...): one reduction iter of the input
    # channels, or three on the bf16 dot product (chunk, pair, lane; tuner.graph.winograd).
    _, _, oc_chunks, _, ob, *reduction = (int(iv.dom.extent) for iv in gemm.iter_vars)
    channels = math.prod(reduction)
    data = math.prod(int(d) for d in mod["main"].params[0].shape)
    return outputs, outputs * channels * 9, data, oc_chunks * ob * channels * 9


def heavy_ops(onnx_path: Path) -> dict[str, HeavyOp]:
    """Every Conv, Gemm and MatMul node of the model, by node name."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(onnx_path)))
    g = model.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*g.value_info, *g.input, *g.output]}
    shapes |= {i.name: list(i.dims) for i in g.initializer}
    out: dict[str, HeavyOp] = {}
    for node in g.node:
        y = shapes.get(node.output[0])
        if node.op_type not in ("Conv", "Gemm", "MatMul") or not y or 0 in y:
            continue
        a, w = shapes.get(node.input[0], []), shapes.get(node.input[1], [])
        attrs = {at.name: onnx.helper.get_attribute_value(at) for at in node.attribute}
        if node.op_type == "Conv" and len(w) == 4 and len(y) == 4:
            kh, kw = w[2:]
            stride = attrs.get("strides", [1])[0]
            groups = attrs.get("group", 1)
            kind = "depthwise " if groups > 1 and groups == y[1] else ""
            label = f"{kind}conv {kh}x{kw}/{stride} {w[1] * groups}->{w[0]} {y[2]}x{y[3]}"
            macs = math.prod(y) * math.prod(w[1:])
        elif a and w:
            k = a[0] if attrs.get("transA") else a[-1]
            label = f"{node.op_type.lower()} {'x'.join(map(str, a))} @ {'x'.join(map(str, w))}"
            macs = math.prod(y) * k
        else:
            continue
        out[node.name] = HeavyOp(node.name, label, math.prod(y), macs, math.prod(a), math.prod(w))
    return out


def match(size: tuple[int, int, int, int], ops: dict[str, HeavyOp]) -> list[HeavyOp]:
    """The ONNX ops of ``size``: the same outputs, multiply-adds, inputs and weights, or, where
    none has all four (bf16 gives an RGB stem a fourth input channel; a conv reading a padded
    copy from its producer counts the border), the same outputs and the nearest count of
    multiply-adds within 1.5x, then of those the nearest count of inputs (a 3x3/2 conv and
    the 3x3/1 ones after it have the same outputs and multiply-adds; the stride-2 one reads
    4x the inputs). Where no op has the same outputs, those whose outputs TVM's padded to
    whole blocks (up to an eighth more: zero filters, a dense layer's zero columns) count."""
    same = [o for o in ops.values() if o.size == size]
    if same:
        return same
    near = [o for o in ops.values() if o.outputs == size[0] and 1 / 1.5 <= size[1] / o.macs <= 1.5]
    if not near:
        near = [o for o in ops.values()
                if o.outputs < size[0] <= o.outputs * 9 / 8 and 1 / 1.5 <= size[1] / o.macs <= 1.5]  # fmt: skip
    if not near:
        return []
    # An input whose shape inference left a dimension unknown (0) counts no inputs: no tie-break by them.
    best = min(near, key=lambda o: (abs(math.log(size[1] / o.macs)),
                                    abs(math.log(size[2] / o.inputs)) if o.inputs else math.inf))  # fmt: skip
    return [o for o in near if (o.macs, o.inputs) == (best.macs, best.inputs)]


def owner(name: str, ops: dict[str, HeavyOp], producer: dict) -> str | None:
    """The heavy ONNX node that a peer's node ``name`` came from: the longest ``/``-prefix of
    the name that names one (OpenVINO appends ``/WithoutBiases`` and the like), or the node
    behind the tensor it is named after, through the unary ops fused after it (ONNX Runtime's
    ``..._nchwc`` nodes, OpenVINO's fully connected layers); ``producer`` maps each tensor
    of the graph to the node writing it."""
    parts = name.split("/")
    for n in range(len(parts), 0, -1):
        prefix = "/".join(parts[:n])
        if prefix in ops:
            return prefix
    node = producer.get(name.removesuffix("_nchwc"))
    while node is not None:
        if node.name in ops:
            return node.name
        if node.op_type not in _UNARY:
            return None
        node = producer.get(node.input[0])
    return None


def producers(onnx_path: Path) -> dict:
    """Each tensor of the graph, mapped to the node that writes it."""
    import onnx

    return {out: node for node in onnx.load(str(onnx_path)).graph.node for out in node.output}


def openvino_profile(onnx_path: Path, inputs: list[np.ndarray], threads: int, rounds: int,
                     precision: str) -> tuple[dict[str, float], dict[str, float], str, dict[str, float]]:  # fmt: skip
    """OpenVINO's per-node times (``PERF_COUNT``), median over ``rounds`` inferences, in ms:
    by heavy ONNX node, the rest by OpenVINO node type; the precision it ran at; and all of
    them by node type and kernel (``Convolution jit_avx2_I8``: its ``exec_type``).
    ``precision`` is its ``INFERENCE_PRECISION_HINT`` (``f32``, ``bf16``): always given,
    since its default is bf16 on CPUs with AVX512_BF16 or AMX."""
    import openvino as ov

    from tuner.peers.openvino_cpu import compile_config

    compiled = ov.Core().compile_model(str(onnx_path), "CPU", compile_config(threads, precision, PERF_COUNT=True))
    ran_at = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    request = compiled.create_infer_request()
    request.infer(inputs)
    ops, producer = heavy_ops(onnx_path), producers(onnx_path)
    per_round: list[tuple[dict[str, float], dict[str, float], dict[str, float]]] = []
    for _ in range(rounds):
        request.infer(inputs)
        heavy: dict[str, float] = defaultdict(float)
        rest: dict[str, float] = defaultdict(float)
        kernels: dict[str, float] = defaultdict(float)
        for p in request.get_profiling_info():
            ms = p.real_time.total_seconds() * 1e3
            kernels[f"{p.node_type} {p.exec_type}"] += ms
            came_from = owner(p.node_name, ops, producer) if p.node_type not in ("Reorder", "Parameter") else None
            if came_from is not None:
                heavy[came_from] += ms
            elif ms:
                rest[p.node_type] += ms
        per_round.append((heavy, rest, kernels))
    return (_median(r[0] for r in per_round), _median(r[1] for r in per_round), ran_at,
            _median(r[2] for r in per_round))  # fmt: skip


def onnxruntime_profile(onnx_path: Path, inputs: list[np.ndarray], threads: int, rounds: int) -> dict[str, float]:
    """ONNX Runtime's per-node kernel times, ms per inference (mean of ``rounds`` + 1 runs),
    by its own node names."""
    import onnxruntime as ort

    from tuner.peers.onnx_runtime import session_options

    opts = session_options(threads)
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in session.get_inputs()], inputs, strict=True))
    session.run(None, feed)
    for _ in range(rounds):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    nodes: dict[str, float] = defaultdict(float)
    types: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            name = e["name"].removesuffix("_kernel_time")
            nodes[name] += e["dur"] / 1e3 / (rounds + 1)  # µs -> ms
            types[name] = e["args"].get("op_name", "?")
    return {f"{types[n]}\t{n}": ms for n, ms in nodes.items()}


def onnxruntime_owners(nodes: dict[str, float], onnx_path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """ONNX Runtime's node times (``onnxruntime_profile``) by heavy ONNX node, the rest by op type."""
    ops, producer = heavy_ops(onnx_path), producers(onnx_path)
    heavy: dict[str, float] = defaultdict(float)
    rest: dict[str, float] = defaultdict(float)
    for key, ms in nodes.items():
        op_type, name = key.split("\t", 1)
        came_from = owner(name, ops, producer)
        if came_from is not None:
            heavy[came_from] += ms
        else:
            rest[op_type] += ms
    return dict(heavy), dict(rest)


def pytorch_profile(module, inputs: list[np.ndarray], threads: int, rounds: int, ops: dict[str, HeavyOp], *,
                    bf16: bool = False) -> tuple[dict[str, float], dict[str, float]]:  # fmt: skip
    """PyTorch eager's conv2d, linear and matmul calls (oneDNN and its GEMMs; batch norm and
    activations are ops of their own there), ms per inference over ``rounds`` forwards under
    ``torch.profiler``, given to the heavy ONNX nodes of the same size (split evenly where
    several share it); calls of no ONNX node's size are returned apart, by op name."""
    import torch

    torch.set_num_threads(threads)
    args = [torch.from_numpy(x) for x in inputs]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    with torch.inference_mode(), autocast:
        module(*args)
        with torch.profiler.profile(record_shapes=True) as prof:
            for _ in range(rounds):
                module(*args)
    by_size: dict[tuple[int, int, int, int], float] = defaultdict(float)
    rest: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.cpu_parent is not None and e.cpu_parent.name in _TORCH_HEAVY:
            continue  # linear's addmm, matmul's bmm: counted with their caller
        size = _torch_size(e.name, e.input_shapes, e.concrete_inputs) if e.name in _TORCH_HEAVY else None
        ms = e.cpu_time_total / 1e3 / rounds  # µs -> ms per inference
        if size is not None:
            by_size[size] += ms
        elif e.name in _TORCH_HEAVY:
            rest[e.name] += ms
    heavy: dict[str, float] = {}
    sizes: dict[tuple[int, int, int, int], list[str]] = defaultdict(list)
    for o in ops.values():
        sizes[o.size].append(o.name)
    for size, ms in by_size.items():
        if size not in sizes:
            rest[f"{size[1]} multiply-adds"] += ms
            continue
        for name in sizes[size]:
            heavy[name] = ms / len(sizes[size])
    return heavy, dict(rest)


_TORCH_HEAVY = ("aten::conv2d", "aten::linear", "aten::matmul", "aten::addmm", "aten::mm", "aten::bmm")


def _torch_size(name: str, shapes: list, concrete: list) -> tuple[int, int, int, int] | None:
    """(outputs, multiply-adds, inputs, weights) of a profiled PyTorch call, as ``heavy_ops`` counts them."""
    if name == "aten::conv2d" and len(shapes[0]) == 4 and len(shapes[1]) == 4:
        (n, _, h, w), (co, ci, kh, kw) = shapes[0], shapes[1]
        stride, pad, dil = (concrete[i] if concrete[i] else [1, 1] for i in (3, 4, 5))
        if isinstance(pad, str):
            return None  # "same"/"valid" padding: not in the zoo
        oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
        outputs = n * co * oh * ow
        return outputs, outputs * ci * kh * kw, math.prod(shapes[0]), math.prod(shapes[1])
    if name == "aten::linear" and shapes[0] and len(shapes[1]) == 2:
        outputs = math.prod(shapes[0][:-1]) * shapes[1][0]
        return outputs, outputs * shapes[1][1], math.prod(shapes[0]), math.prod(shapes[1])
    a, b = (shapes[1], shapes[2]) if name == "aten::addmm" else (shapes[0], shapes[1])
    if len(a) >= 2 and len(b) >= 2:
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        outputs = math.prod(batch) * a[-2] * b[-1]
        return outputs, outputs * a[-1], math.prod(a), math.prod(b)
    return None


def _median(rounds) -> dict[str, float]:
    rounds = list(rounds)
    names = {n for r in rounds for n in r}
    return {n: statistics.median(r.get(n, 0.0) for r in rounds) for n in names}
