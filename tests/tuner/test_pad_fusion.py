"""A conv's padded input (bf16, and uint8 in int8), written by the function that produces it
(tuner.graph.pad_fusion)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax

from search_spaces.templates.x86_conv2d_nchwc_dot import PADDED_OUTPUT
from tuner.compile import compile_model, run_model
from tuner.db import TuningDatabase
from tuner.device import host_cpu_info, parse_device
from tuner.frontends import ModelSpec
from tuner.graph.pad_fusion import PAD_ATTR, pad_interior, zero_border
from tuner.graph.tasks import extract_tasks
from tuner.measure.verify import arg_specs

needs_bf16 = pytest.mark.skipif("avx512_bf16" not in host_cpu_info()["isa_flags"],
                                reason="this CPU has no AVX512_BF16")  # fmt: skip


def _chain(name: str, first: int, then: int, readers: int, seed: int) -> ModelSpec:
    """conv ``first`` x ``first`` 32->32 + bias + relu on a 14x14 map, read by ``readers``
    convs ``then`` x ``then`` + relu (3x3 ones padded by 1), whose outputs are summed."""
    rng = np.random.default_rng(seed)

    def const(*shape: int) -> relax.Constant:
        return relax.const(rng.normal(0, 0.3, shape).astype("float32"))

    def conv(data: relax.Expr, k: int) -> relax.Expr:
        return op.nn.conv2d(data, const(32, 32, k, k), padding=k // 2)

    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 14, 14), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.relu(op.add(conv(x, first), const(1, 32, 1, 1))))
            outs = [bb.emit(op.nn.relu(conv(y, then))) for _ in range(readers)]
            total = outs[0]
            for other in outs[1:]:
                total = bb.emit(op.add(total, other))
            out = bb.emit_output(total)
        bb.emit_func_output(out)
    return ModelSpec(f"{name}_{readers}", bb.get())


def _model(readers: int) -> ModelSpec:
    """A 1x1 conv read by ``readers`` 3x3 convs (:func:`_chain`)."""
    return _chain("pad_fusion", 1, 3, readers, 11)


def _expansion(readers: int) -> ModelSpec:
    """A 3x3 conv read by ``readers`` stride-1 1x1 convs: ResNet's expansion conv after the
    3x3 (:func:`_chain`)."""
    return _chain("expansion", 3, 1, readers, 12)


def _tasks(spec: ModelSpec):
    """The bf16 tasks for a Zen 4 (AVX512_BF16, no AMX): extraction builds nothing, so the
    graph checks run on any host."""
    return extract_tasks(spec.bound(), parse_device("cpu", target_arch="znver4").target, precision="bf16")


def test_the_producing_conv_writes_the_padded_input():
    """The 3x3 conv's padding is no function of its own: the 1x1 conv's function ends by
    copying its tile into the interior of the padded shape (16x16 for a 14x14 map)."""
    tasks = _tasks(_model(1))
    assert not [t.name for t in tasks if t.name.startswith("pad_")], [t.name for t in tasks]
    [producer] = [t for t in tasks if "_pad_NCHWc" in t.name]
    assert arg_specs(producer.mod)[-1].shape == (1, 2, 16, 16, 16)
    sch = tvm.s_tir.Schedule(producer.mod)
    last = list(sch.get_child_blocks(sch.get_sblock("root")))[-1]
    assert sch.get(last).name_hint == PADDED_OUTPUT
    assert "conv2d_NCHWc_dot" in producer.name


def test_an_output_that_two_convs_read_is_padded_on_its_own():
    """Two readers: the producer's output stays unpadded, each conv's padding a function."""
    names = [t.name for t in _tasks(_model(2))]
    assert "pad_NCHWc" in names and not [n for n in names if "_pad_NCHWc" in n], names


@needs_bf16
@pytest.mark.parametrize("model", [_model, _expansion])
@pytest.mark.parametrize("readers", [1, 2])
def test_the_model_computes_what_fp32_does(model, readers, tmp_path):
    """Compiled with the database (the folded functions on their fallback schedules, the
    border zeroed in place; on an AMX host the wide blocks too): within bf16's tolerance of
    the fp32 build (3e-2 of the scale)."""
    spec, device = model(readers), parse_device("cpu")
    x = np.random.default_rng(2).uniform(-1, 1, (1, 32, 14, 14)).astype("float32")
    want, _ = run_model(compile_model(spec, device, None), device, [x], budget_s=0.05)
    compiled = compile_model(spec, device, TuningDatabase(str(tmp_path / "empty.db")), precision="bf16")
    got, _ = run_model(compiled, device, [x], budget_s=0.05)
    assert np.max(np.abs(got[0] - want[0])) / np.max(np.abs(want[0])) < 3e-2


def test_zero_border_zeroes_the_border_alone():
    shape, padding = (1, 2, 5, 6, 16), (1, 2, 2, 1)  # top, left, bottom, right
    func = zero_border(shape, padding, "bfloat16").with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    padded = np.random.default_rng(0).uniform(0.5, 1, (1, 2, 8, 9, 16)).astype(ml_dtypes.bfloat16)
    y = tvm.runtime.tensor(padded)
    lib["main"](y)
    got = y.numpy().astype(np.float32)
    border = np.ones(got.shape, bool)
    border[:, :, 1:6, 2:8] = False
    assert not got[border].any()
    np.testing.assert_array_equal(got[~border], padded.astype(np.float32)[~border])


def test_amx_convs_read_wide_blocks_that_their_producer_writes():
    """On AMX a 3x3 conv over 32 bf16 channels reads them in one block of 32 (a whole tile
    row): the 1x1 conv before it stores each tile into the padded NCHW32c buffer; a Zen 4
    target keeps 16. Extraction builds nothing, so this runs on any host."""
    from tuner.graph.layout.plan import wide_blocks

    zen4 = parse_device("cpu", target_arch="znver4").target
    amx = parse_device("cpu", target_arch="sapphirerapids").target
    assert wide_blocks(zen4) == {} and wide_blocks(amx) == {"bfloat16": 32, "uint8": 64}
    tasks = extract_tasks(_model(1).bound(), amx, precision="bf16")
    assert not [t.name for t in tasks if t.name.startswith("pad_")], [t.name for t in tasks]
    [producer] = [t for t in tasks if "_pad_NCHWc" in t.name and "conv2d" in t.name]
    assert arg_specs(producer.mod)[-1].shape == (1, 1, 16, 16, 32)


@pytest.mark.parametrize("readers", [1, 2])
def test_an_amx_1x1_conv_reads_wide_blocks_where_nothing_else_reads_its_data(readers):
    """On AMX a stride-1 1x1 conv over 32 bf16 channels that alone reads them takes them in
    one block of 32, stored so by the 3x3 conv before it (no copy of its own); where two convs
    read them they stay in blocks of 16 (a copy would be a pass over the data)."""
    amx = parse_device("cpu", target_arch="sapphirerapids").target
    tasks = extract_tasks(_expansion(readers).bound(), amx, precision="bf16")
    names = [t.name for t in tasks]
    assert not [n for n in names if n.startswith("pad_")], names
    [conv3] = [t for t in tasks if "conv2d" in t.name and arg_specs(t.mod)[1].shape[2:4] == (3, 3)]
    [*_, last] = arg_specs(conv3.mod)
    conv1 = [t for t in tasks if "conv2d" in t.name and arg_specs(t.mod)[1].shape[2:4] == (1, 1)]
    block = (1, 1, 14, 14, 32) if readers == 1 else (1, 2, 14, 14, 16)
    assert ("_pad_NCHWc" in conv3.name) == (readers == 1) and last.shape == block
    assert conv1 and all(arg_specs(t.mod)[0].shape == block for t in conv1), names


def test_a_wide_padded_copy_puts_neighbouring_chunks_side_by_side():
    """pad_interior into NCHW32c from NCHW16c (what an AMX bf16 conv reads): chunk 2c + j
    of the data is lanes 16 j to 16 j + 15 of wide chunk c, at the padded offset; the
    border is zero_border's, left as it was."""
    shape, padding = (1, 4, 5, 6, 16), (1, 1, 1, 1)
    func = pad_interior(shape, padding, "float32", block=32).with_attr("global_symbol", "main")
    assert func.attrs.get(PAD_ATTR), "the producer's to fold, as a copy into NCHW16c"
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    x = np.random.default_rng(0).uniform(0.5, 1, shape).astype(np.float32)
    y = tvm.runtime.tensor(np.full((1, 2, 7, 8, 32), -1.0, np.float32))
    lib["main"](tvm.runtime.tensor(x), y)
    want = np.full((1, 2, 7, 8, 32), -1.0, np.float32)
    want[:, :, 1:6, 1:7] = x.reshape(1, 2, 2, 5, 6, 16).transpose(0, 1, 3, 4, 2, 5).reshape(1, 2, 5, 6, 32)
    np.testing.assert_array_equal(y.numpy(), want)
