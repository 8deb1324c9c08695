"""Shared fixtures: a real local Ray cluster, SQLite and a real PostgreSQL database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

# Tests of bf16 test its dot-product kernels wherever the CPU has vdpbf16ps, an Intel core
# without AMX included, where `tune` computes bf16 on fp32 FMAs by default
# (tuner.precision.bf16_arithmetic; its own tests unset this). Subprocesses inherit it.
os.environ.setdefault("NIGHTSHIFT_BF16_ARITHMETIC", "bf16")
PG_ADMIN_URL = os.environ.get("NIGHTSHIFT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
LIGHT_RESNET50 = (
    Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
)


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory) -> Iterator[None]:
    """Caches (rebuilt features, quantized models) in the session's temporary directory, not the
    user's; processes the tests start (Ray workers, ``tune``) inherit it."""
    if "NIGHTSHIFT_CACHE" in os.environ:
        yield
        return
    os.environ["NIGHTSHIFT_CACHE"] = str(tmp_path_factory.mktemp("nightshift-cache"))
    yield
    os.environ.pop("NIGHTSHIFT_CACHE", None)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray cluster for the whole session."""
    import ray

    from tuner.measure.ray_measure import connect

    connect(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped after the session."""
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"nightshift_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path: Path) -> Iterator[str]:
    """A database URL on each backend; the PostgreSQL one gets its own schema-free database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuning.db'}"
        return
    base = request.getfixturevalue("pg_server_url")
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    name = f"ns_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def light_resnet50() -> Path:
    """ResNet-50 from the ONNX model zoo, shipped inside the onnx wheel."""
    assert LIGHT_RESNET50.is_file(), LIGHT_RESNET50
    return LIGHT_RESNET50


@pytest.fixture(scope="session")
def cpu_device():
    """The host CPU as a Nightshift device."""
    from tuner.device import parse_device

    return parse_device("cpu")


# ----- test tiers -----------------------------------------------------------------------------
# Markers by what a test needs, set here from its fixtures and its body so that no test has to
# remember them: `ray` (a Ray cluster: the fixtures, or a job or `tune` run that starts one),
# `postgres` (the PostgreSQL server), `browser` (headless Chromium), `slow` (set by hand);
# `fast` is every test with none of them: `pytest -m fast -n 2` is the contributor's loop.
_RAY_FIXTURES = {"ray_cluster", "multinode", "make_measurer", "two_nodes"}
_PG_FIXTURES = {"pg_server_url"}
_RAY_CALLS = ("RayMeasurer", "connect(", "tune_main(", '"tune"', "'tune'", "TuningJob(", "tune_tasks(", "morning_job",
              "ray.init", "DeviceActor(")  # fmt: skip


def _needs(item: pytest.Item) -> set[str]:
    import inspect

    fixtures = set(getattr(item, "fixturenames", ()))
    needs = set()
    params = getattr(getattr(item, "callspec", None), "params", {})
    if fixtures & _RAY_FIXTURES or params.get("measurer") == "ray":
        needs.add("ray")
    if fixtures & _PG_FIXTURES or params.get("db_url") == "postgresql":
        needs.add("postgres")
    if "chromium" in item.name:
        needs.add("browser")
    try:
        source = inspect.getsource(item.function)  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError):
        source = ""
    if any(call in source for call in _RAY_CALLS) and 'measurer="inline"' not in source:
        needs.add("ray")
    return needs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        needs = _needs(item)
        for name in needs:
            item.add_marker(getattr(pytest.mark, name))
        if not needs and item.get_closest_marker("slow") is None and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.fast)
