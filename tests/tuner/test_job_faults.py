"""A job's own faults: its PostgreSQL server out of reach (a real TCP proxy in front of the
real server, stopped and started) is waited for with backoff; past the wait the job stops
with a clear error and the batch it could not store is kept and written on resume. A job
none of whose candidates can be measured stops with the cause instead of failing every
task to its limit."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid

import pytest
import sqlalchemy as sa
import tvm
from job_tasks import matmul_task
from tvm import te

from tuner.db import NewRecord, TuningDatabase
from tuner.errors import DatabaseError
from tuner.graph.keys import workload_key
from tuner.graph.tasks import Task
from tuner.job import NothingMeasurable, TuneConfig, TuningJob
from tuner.measure.base import MeasureConfig
from tuner.measure.results import ErrorClass


class Proxy:
    """Forwards a local port to the PostgreSQL server; ``stop`` cuts every connection and
    refuses new ones, as a lost server or network does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._conns: list[socket.socket] = []
        self._server: socket.socket | None = None

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            # shutdown, not only close: close would leave the socket listening while the
            # accept thread holds it.
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxied_db(pg_server_url):
    """A fresh PostgreSQL database reached through a :class:`Proxy`."""
    admin = sa.create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    name = f"ns_fault_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.make_url(pg_server_url).set(database=name)
    proxy = Proxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    db = TuningDatabase(url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
    yield db, proxy
    proxy.stop()
    db.close()
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _task() -> Task:
    a = te.placeholder((16, 16), name="A")
    b = te.compute((16, 16), lambda i, j: a[i, j] * 2.0, name="B")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    return Task("double", mod, 1, 256.0, workload_key(mod))


def _job(db, device, tmp_path, retry_s: float, events: list) -> TuningJob:
    task = _task()
    job = TuningJob([task], device, db, TuneConfig(trials=4, retry_s=retry_s, spool_dir=tmp_path, name="f"),
                    model_name="m", on_event=events.append)  # fmt: skip
    job.device_id = db.device_id(device)
    db.workload_id(task.workload_key, task.name, task.mod, task.flops)
    job.job_id = db.start_job("m", job.device_id, {}, 4, name="f")
    return job


def _record(task: Task, n: int) -> NewRecord:
    return NewRecord(workload_key=task.workload_key, point=json.dumps({"n": n}), record_json="{}",
                     run_secs=[1e-5 * (n + 1)], program_hash=f"h{n}")  # fmt: skip


def test_lost_database_is_waited_for(proxied_db, cpu_device, tmp_path):
    db, proxy = proxied_db
    events: list = []
    job = _job(db, cpu_device, tmp_path, 60, events)
    proxy.stop()
    threading.Timer(3.0, proxy.start).start()
    job._store([_record(job.tasks[0], 0)])
    assert db.count_records() == 1
    retries = [e for e in events if e["event"] == "retry"]
    assert retries and retries[0]["what"] == "database" and retries[0]["delay_s"] == 1.0


def test_database_lost_for_good_stops_clearly_and_loses_nothing(proxied_db, cpu_device, tmp_path):
    db, proxy = proxied_db
    job = _job(db, cpu_device, tmp_path, 3, [])
    proxy.stop()
    records = [_record(job.tasks[0], n) for n in range(3)]
    with pytest.raises(DatabaseError, match="3 measurements it could not take are kept in"):
        job._store(records)
    spool = job._spool_path()
    assert len(spool.read_text().splitlines()) == 3
    # The resumed job writes them first, once.
    proxy.start()
    job._unspool()
    job._unspool()
    assert not spool.exists()
    assert db.count_records() == 3
    assert db.job_trials(job.job_id) == 3


def test_job_whose_every_candidate_fails_stops_with_the_cause(ray_cluster, cpu_device, tmp_path):
    # A build timeout no build can meet: every candidate of every task fails, as with a target
    # the CPU cannot run or a broken worker, but on any machine. Each timed-out build takes
    # its Ray worker down with it, so the threshold is lowered from 32 to keep the test short.
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    tasks = [matmul_task(n) for n in (16, 24, 32)]
    config = TuneConfig(trials=100, batch_size=4, measure=MeasureConfig(build_timeout_s=1e-3), name="hopeless",
                        hopeless_after=12)  # fmt: skip
    job = TuningJob(tasks, cpu_device, db, config, model_name="m")
    with pytest.raises(NothingMeasurable, match=r"none succeeded \(build_timeout.*--build-timeout") as info:
        job.run()
    assert "run the same command to resume" in str(info.value)
    row = db.find_job("hopeless", db.device_id(cpu_device))
    assert row is not None and row.state == "failed"
    # Stopped soon after the threshold, long before each task's own limit (64 failures each),
    # with every failure it measured recorded.
    assert config.hopeless_after <= db.job_trials(row.id) < config.hopeless_after + 3 * config.batch_size
    assert db.job_trials(row.id) == sum(job.errors.values()) == job.errors["build_timeout"]
    db.close()


def test_candidates_whose_traces_the_allow_list_refuses_fail_loudly(ray_cluster, cpu_device, tmp_path, monkeypatch):
    # About the job, not the allow-list: a stand-in refuses every trace, as the real one did
    # the vpdpbusd sketches' empty tensorize annotation until 2026-11-27 (then the compile
    # silently passed over every record of that operator).
    monkeypatch.setattr("tuner.job.trace_rejection", lambda trace: "annotation key 'x' is not allowed")
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    tasks = [matmul_task(n) for n in (16, 24)]
    config = TuneConfig(trials=16, batch_size=4, name="refused", hopeless_after=8)
    job = TuningJob(tasks, cpu_device, db, config, model_name="m")
    with pytest.raises(NothingMeasurable, match=r"refused_trace: trace refused by tuner.db.validate's allow-list"):
        job.run()
    assert job.errors.keys() == {ErrorClass.REFUSED_TRACE} and job._run_ok == 0
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT error_class, mean_sec FROM records")).all()
    assert rows and all(r.error_class == ErrorClass.REFUSED_TRACE and r.mean_sec is None for r in rows)
    db.close()
