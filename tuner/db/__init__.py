"""The SQL tuning database and its adapter to TVM MetaSchedule's Database interface."""

from tuner.db.selection import BestRecord
from tuner.db.store import NewRecord, TuningDatabase
from tuner.db.url import database_url, redact

__all__ = ["BestRecord", "NewRecord", "TuningDatabase", "database_url", "redact"]
