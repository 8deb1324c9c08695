"""The SQL tuning database and its adapter to TVM MetaSchedule's Database interface."""

from tuner.db.database import BestRecord, NewRecord, TuningDatabase
from tuner.db.url import database_url, redact

__all__ = ["BestRecord", "NewRecord", "TuningDatabase", "database_url", "redact"]
