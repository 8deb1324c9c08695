"""apache-tvm-ffi 0.1.15.x segfaults serializing IR; this fails loudly if the pin slips."""

import subprocess
import sys

import pytest

SCRIPT = """
import tvm
from tvm import te
a = te.placeholder((4,), name="a")
b = te.compute((4,), lambda i: a[i] * 2, name="b")
mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
text = tvm.ir.save_json(mod)
back = tvm.ir.load_json(text)
import tvm_ffi
assert tvm_ffi.structural_equal(mod, back)
print("OK", tvm_ffi.__version__)
"""


@pytest.mark.slow
def test_primfunc_json_round_trip_in_a_subprocess():
    # A subprocess so that a segfault is a test failure, not a dead test run.
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"IR serialization crashed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("OK 0.1.14"), proc.stdout
