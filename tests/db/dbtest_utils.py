"""Small workloads and devices shared by the database tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import sqlalchemy as sa
import tvm
from tvm import te

from tuner.device import Device


def add_mod(n: int = 8, name: str = "add") -> tvm.IRModule:
    """``b = a + 1`` on n floats: a workload that builds in milliseconds."""
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] + 1, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", name)})


def matmul_mod(n: int = 64) -> tvm.IRModule:
    """An n x n x n matmul: small, with a multi-level-tiling design space."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c]).with_attr("global_symbol", "matmul")})


def fake_cpu(base: Device, *, mcpu: str | None = None, cores: int | None = None, model: str | None = None) -> Device:
    """A CPU device record like ``base`` but another machine (other fingerprint and/or arch).

    Only used as rows in the database: nothing is built for or run on it.
    """
    config = dict(base.target_config)
    desc = dict(base.description)
    if mcpu is not None:
        config["mcpu"] = desc["mcpu"] = mcpu
    if cores is not None:
        config["num-cores"] = desc["cores"] = cores
    if model is not None:
        desc["model"] = model
    return Device(kind="cpu", index=0, target_config=config, description=desc)


FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(name: str, db_url: str, tmp_path: Path) -> str:
    """The fixture database ``fixtures/<name>.sqlite`` / ``<name>.pg.sql`` at ``db_url`` (SQLite:
    a copy of the checked-in file); the URL or path to open it by."""
    if db_url.startswith("sqlite"):
        path = tmp_path / "old.db"
        shutil.copy(FIXTURES / f"{name}.sqlite", path)
        return str(path)
    # pg_dump's psql meta-commands (\restrict) are not SQL; the rest is plain SQL.
    dump = "\n".join(line for line in (FIXTURES / f"{name}.pg.sql").read_text().splitlines()
                     if not line.startswith("\\"))  # fmt: skip
    engine = sa.create_engine(db_url)
    raw = engine.raw_connection()
    try:
        raw.cursor().execute(dump)
        raw.commit()
    finally:
        raw.close()
        engine.dispose()
    return db_url


def run_at_once(target, args_of, procs: int, timeout_s: float) -> list:
    """Start ``procs`` spawned processes of ``target(*args_of(i), barrier, errors)`` that meet
    at a barrier, and fail the test if one hangs, reports an error or exits non-zero."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    errors = ctx.Queue()
    started = [ctx.Process(target=target, args=(*args_of(i), barrier, errors)) for i in range(procs)]
    for p in started:
        p.start()
    for p in started:
        p.join(timeout_s)
    hung = [p.pid for p in started if p.is_alive()]
    for p in started:
        if p.is_alive():
            p.kill()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not hung, f"processes {hung} still running after {timeout_s} s (deadlock?)"
    assert not failures, "\n".join(failures)
    assert [p.exitcode for p in started] == [0] * procs
    return started


# The smallest record the gate passes (an empty trace): for tests of storage, not of replay.
EMPTY_RECORD = "[[[], []], null, null, null]"
