"""The tuning database's tables (SQLAlchemy 2 declarative models).

Only plain data goes in: JSON text, numbers, and XGBoost's own UBJSON for cost models;
nothing is pickled, so a shared database is safe to read. These models describe the newest
schema; ``tuner/db/migrations`` creates and upgrades real databases to it (never
``create_all``), so a change here needs a new migration.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Kept in nightshift_meta by the migrations, for people reading the database; alembic's
# revision is what Nightshift checks.
SCHEMA_VERSION = 7


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base of every Nightshift table."""


class Meta(Base):
    """Key-value facts about the database itself (schema version)."""

    __tablename__ = "nightshift_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class DeviceRow(Base):
    """A device fingerprint and what it describes."""

    __tablename__ = "devices"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(32), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text)
    # keys.device_class: devices of one machine type, whose records are looked up together.
    device_class: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(default=_now)


class WorkloadRow(Base):
    """One fused operator: its structural key and MetaSchedule's serialized workload."""

    __tablename__ = "workloads"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(256))
    flops: Mapped[float] = mapped_column(Float, default=0.0)
    # MetaSchedule's Workload.as_json(): [structural hash, base64 of the IR's JSON].
    workload_json: Mapped[str] = mapped_column(Text)
    # Readable one-liner: function name and argument shapes.
    summary: Mapped[str | None] = mapped_column(Text, nullable=True)
    # TVM that serialized workload_json; its IR encoding changes between versions.
    tvm_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=_now)


class JobRow(Base):
    """A tuning job: its configuration, state and progress."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_name", "name"),
        # One running job per name and device: two `tune --job X` started at once cannot
        # both run (the loser's insert fails; migration 0007).
        Index("ux_jobs_running", "name", "device_id", unique=True,
              sqlite_where=text("state = 'running'"), postgresql_where=text("state = 'running'")),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # What a user resumes by (tune --job NAME); NULL for jobs older than schema 4.
    name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    model: Mapped[str] = mapped_column(String(512))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    config: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="running")
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    trials_total: Mapped[int] = mapped_column(Integer, default=0)
    host: Mapped[str | None] = mapped_column(String(256), nullable=True)
    tvm_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # None: no time budget. elapsed_sec sums the tuning time of every run of the job.
    time_budget_sec: Mapped[float | None] = mapped_column(Float, nullable=True)
    elapsed_sec: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # A running job writes this at least every minute; a stale one means the job is dead.
    heartbeat_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=_now)
    updated_at: Mapped[datetime] = mapped_column(default=_now, onupdate=_now)


class RecordRow(Base):
    """One measured (or failed) candidate of a workload on a device."""

    __tablename__ = "records"
    __table_args__ = (
        # The best-schedule lookup reads this index in order and stops after k entries:
        # only successful records of one timing mode, ordered as the query orders them
        # (mean, then id).
        Index(
            "ix_records_best_ok", "workload_id", "device_id", "timing", "mean_sec", "id",
            sqlite_where=text("error_class IS NULL AND mean_sec IS NOT NULL"),
            postgresql_where=text("error_class IS NULL AND mean_sec IS NOT NULL"),
        ),
        Index("ix_records_job", "job_id"),
        # What has been measured of a workload on a device (TuningDatabase.measured_hashes,
        # measured_points): one range of this index.
        Index("ix_records_program", "workload_id", "device_id", "program_hash"),
        UniqueConstraint("record_key", name="uq_records_record_key"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # sha256 of (workload, device, point), not of the job: a candidate is measured once per
    # device, whoever measures it, and a retried write is a no-op (see keys.record_key).
    # Hashing keeps the unique index small; PostgreSQL refuses btree keys over ~2.7 kB and a
    # point's JSON can be longer.
    record_key: Mapped[str] = mapped_column(String(64))
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), nullable=True)
    point: Mapped[str] = mapped_column(Text)
    # Structural hash of the scheduled program (tuner.graph.tasks.program_hash): different points
    # can give the same program. NULL for records written before schema 3.
    program_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # MetaSchedule's TuningRecord.as_json(): trace, run_secs, target, args_info.
    record_json: Mapped[str] = mapped_column(Text)
    run_secs: Mapped[str] = mapped_column(Text, default="[]")
    mean_sec: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # How it was timed: "warm" (repeated calls on warm caches) or "cold" (the caches flushed
    # before every run, TimingConfig.flush_cache). Warm times are lower; the two are never
    # ranked against each other.
    timing: Mapped[str] = mapped_column(String(8), default="warm", server_default="warm")
    error_msg: Mapped[str | None] = mapped_column(Text, nullable=True)
    build_sec: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Wall time of the measurement step (upload, warm-up, repeats), not the kernel time.
    run_wall_sec: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Who wrote it. For an import, tvm_version is source_tvm_version or "unknown".
    tvm_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(256))
    os_user: Mapped[str | None] = mapped_column(String(128), nullable=True)
    nightshift_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # "local" (measured by Nightshift) or "import" (a foreign MetaSchedule database: its
    # timings were not taken here; used only when nothing local is, after a replay check).
    origin: Mapped[str] = mapped_column(String(16), default="local", server_default="local")
    source_file: Mapped[str | None] = mapped_column(Text, nullable=True)
    source_device: Mapped[str | None] = mapped_column(Text, nullable=True)
    source_tvm_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=_now)


class CostModelRow(Base):
    """A trained cost model, serialized in its library's own safe format."""

    __tablename__ = "cost_models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    kind: Mapped[str] = mapped_column(String(32))
    format: Mapped[str] = mapped_column(String(16))
    num_samples: Mapped[int] = mapped_column(Integer)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=_now)
