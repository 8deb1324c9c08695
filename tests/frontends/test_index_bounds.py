"""Inputs that index a table (token ids): the values they may hold, and the artifact's check of them.

TVM lowers ``relax.take`` in its ``fast`` mode, which reads outside the table for an index out
of range: BERT-base's token id 30522 crashed ``nightshift run`` with a segfault before the
artifact checked its inputs against these bounds, and before the deployed library took its
indices in ``clip`` mode.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tuner.artifact import write_artifact
from tuner.compile import compile_model
from tuner.frontends import load_model
from tuner.frontends.model import ModelSpec, clip_takes

sys.path.insert(0, str(Path(__file__).parents[1] / "tuner"))
from morning_job import one_line_error, run

ROWS, WIDTH = 50, 8


def _embedding(offset: int = 0) -> ModelSpec:
    """``table[reshape(ids + offset)]``: ids (1, 4) int64, a (50, 8) float table as a weight."""
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 4), "int64"))
    table = relax.Var("table", relax.TensorType((ROWS, WIDTH), "float32"))
    with bb.function("main", [ids, table]):
        with bb.dataflow():
            index = ids if offset == 0 else bb.emit(relax.op.add(ids, relax.const(offset, "int64")))
            flat = bb.emit(relax.op.reshape(index, (4,)))
            out = bb.emit_output(relax.op.take(table, flat, axis=0))
        bb.emit_func_output(out)
    values = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype("float32")
    return ModelSpec("embedding", bb.get(), {"table": values})


def test_an_input_that_indexes_a_table_is_bounded_by_its_rows():
    spec = _embedding()
    assert [(i.name, i.bounds) for i in spec.inputs] == [("ids", (0, ROWS))]
    # The random inputs tune and bench time with stay inside a table smaller than their usual 100.
    assert all(int(spec.random_inputs(seed)[0].max()) < ROWS for seed in range(20))
    # An index computed from the input by other arithmetic is not bounded: its range is unknown.
    assert _embedding(offset=1).inputs[0].bounds is None
    assert load_model("tiny").inputs[0].bounds is None


def test_onnx_gather_takes_negative_indices_too(tmp_path):
    """ONNX's Gather counts negative indices from the end; the frontend wraps them before the take."""
    table = numpy_helper.from_array(np.zeros((ROWS, WIDTH), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["out"], axis=0)], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, WIDTH])], initializer=[table])  # fmt: skip
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    assert [(i.name, i.bounds) for i in load_model(str(path)).inputs] == [("ids", (-ROWS, ROWS))]


@pytest.mark.slow
def test_nightshift_run_refuses_an_index_beyond_the_table(cpu_device, tmp_path):
    spec = _embedding()
    compiled = compile_model(spec, cpu_device, None)
    meta = write_artifact(tmp_path / "emb.so", compiled, spec, cpu_device, latency_s=None, verification=None)
    assert '"bounds": [\n        0,\n        50\n      ]' in meta.read_text()
    ids = np.array([[0, 7, 49, 3]], np.int64)
    np.save(tmp_path / "ok.npy", ids)
    proc = run("nightshift", "run", "emb.so", "--input", "ok.npy", "--output", "y.npy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    want = spec.params["table"][ids.reshape(-1)]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
    for name, bad in (("past.npy", [[0, 50, 1, 2]]), ("negative.npy", [[0, 1, -1, 2]])):
        np.save(tmp_path / name, np.array(bad, np.int64))
        error = one_line_error(run("nightshift", "run", "emb.so", "--input", name, cwd=tmp_path))
        assert "outside [0, 50)" in error and "ids" in error, error


def test_the_deployed_library_never_reads_outside_the_table(cpu_device):
    """Called through TVM's runtime, past the loader's check, an index out of range reads the
    nearest row; in ``fast`` mode it would read whatever memory lies past the table."""
    spec = _embedding()
    bound = spec.bound()
    takes = [b.value for b in bound["main"].body.blocks[0].bindings if getattr(b.value.op, "name", "") == "relax.take"]
    assert [str(t.attrs.mode) for t in takes] == ["clip"]
    assert clip_takes(bound).script() == bound.script()  # once is enough
    vm = relax.VirtualMachine(compile_model(spec, cpu_device, None).executable, tvm.cpu())
    ids = np.array([[0, 10**9, -(10**9), 3]], np.int64)
    out = vm["main"](tvm.runtime.tensor(ids)).numpy()
    table = spec.params["table"]
    np.testing.assert_array_equal(out, table[[0, ROWS - 1, 0, 3]])
