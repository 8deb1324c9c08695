"""A host-local cache of the features rebuilt from stored records.

A job starts by training its cost model on the database's records of the device family
(:func:`cost_models.pretrain`): each record's trace is replayed on its workload and TVM's
per-store features are extracted, about 20 ms a record on a 2-core host, so 2,000 records
cost 40 s before the first proposal, at every start of every job on a shared database.
The features of a record never change for one TVM, one feature layout and one target, so
they are kept here, keyed by all of those, and each record is rebuilt once per host.

The cache is one SQLite file, ``features.sqlite`` under ``$NIGHTSHIFT_CACHE`` (default
``~/.cache/nightshift``); ``NIGHTSHIFT_FEATURE_CACHE=off`` turns it off. It is a cache and
nothing more: a file that cannot be opened, read or written is reported once and the
features are rebuilt, as without it. It keeps the newest ``max_entries`` records.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import tvm

from cost_models.features import FEATURE_WIDTH
from tuner.host import cache_root

logger = logging.getLogger(__name__)

#: Bump when the features of a record change without TVM's version or FEATURE_WIDTH changing.
FEATURE_VERSION = 1
#: Stored instead of features for a record that does not replay on this TVM.
NO_REPLAY = None

_SCHEMA = ("CREATE TABLE IF NOT EXISTS features "
           "(key TEXT PRIMARY KEY, stores INTEGER NOT NULL, blob BLOB, written REAL NOT NULL)")  # fmt: skip


def feature_key(workload_key: str, target: tvm.target.Target, record_json: str) -> str:
    """The cache key of one record's features: what they are a function of."""
    h = hashlib.sha256()
    for part in (f"v{FEATURE_VERSION}:{FEATURE_WIDTH}", tvm.__version__, workload_key, str(target), record_json):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class FeatureCache:
    """Per-record feature rows in a SQLite file; every failure degrades to a miss.

    Args:
        path: the SQLite file (its directory is created).
        max_entries: records kept; the oldest written go first.
    """

    def __init__(self, path: Path, *, max_entries: int = 200_000) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._conn: sqlite3.Connection | None = None
        self._broken = False
        self._written = False

    @classmethod
    def default(cls) -> FeatureCache | None:
        """The host's cache, or None where ``NIGHTSHIFT_FEATURE_CACHE`` is ``off``/``0``."""
        if os.environ.get("NIGHTSHIFT_FEATURE_CACHE", "").strip().lower() in ("off", "0", "false", "no"):
            return None
        return cls(cache_root() / "features.sqlite")

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None and not self._broken:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Several jobs on one host may rebuild at once: WAL lets them read while one writes.
                conn = sqlite3.connect(self.path, timeout=30)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_SCHEMA)
                conn.commit()
                self._conn = conn
            except (sqlite3.Error, OSError) as err:
                self._fail("open", err)
        return self._conn

    def _fail(self, what: str, err: BaseException) -> None:
        self._broken = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        logger.warning("feature cache %s: cannot %s it (%s); features are rebuilt without it", self.path, what, err)

    def get_many(self, keys: Iterable[str]) -> dict[str, np.ndarray | None]:
        """The cached entries among ``keys``: feature rows, or :data:`NO_REPLAY`."""
        keys = list(dict.fromkeys(keys))
        conn = self._connect()
        found: dict[str, np.ndarray | None] = {}
        if conn is None or not keys:
            self.misses += len(keys)
            return found
        try:
            for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                chunk = keys[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for key, stores, blob in conn.execute(f"SELECT key, stores, blob FROM features WHERE key IN ({marks})",
                                                      chunk):  # fmt: skip
                    entry = _decode(stores, blob)
                    if entry is not False:
                        found[key] = entry  # type: ignore[assignment]
        except sqlite3.Error as err:
            self._fail("read", err)
            found = {}
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, entries: Mapping[str, np.ndarray | None]) -> None:
        """Store feature rows (or :data:`NO_REPLAY`) per key."""
        conn = self._connect()
        if conn is None or not entries:
            return
        now = time.time()
        rows = []
        for key, feats in entries.items():
            if feats is None:
                rows.append((key, -1, None, now))
            else:
                feats = np.ascontiguousarray(feats, dtype=np.float32)
                rows.append((key, len(feats), zlib.compress(feats.tobytes(), 1), now))
        try:
            with conn:
                conn.executemany("INSERT OR REPLACE INTO features VALUES (?, ?, ?, ?)", rows)
            self._written = True
        except sqlite3.Error as err:
            self._fail("write", err)

    def close(self) -> None:
        """Keep the newest ``max_entries`` (once, after a rebuild's writes: counting the table
        scans it) and close the file."""
        if self._conn is None:
            return
        try:
            if self._written:
                with self._conn:
                    (count,) = self._conn.execute("SELECT count(*) FROM features").fetchone()
                    if count > self.max_entries:
                        oldest = "SELECT key FROM features ORDER BY written LIMIT ?"
                        self._conn.execute(f"DELETE FROM features WHERE key IN ({oldest})", (count - self.max_entries,))
        except sqlite3.Error as err:
            self._fail("prune", err)
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _decode(stores: int, blob: bytes | None) -> np.ndarray | bool | None:
    """Feature rows from a stored entry, None for a record that does not replay, False for an
    entry that does not read back (another width, a damaged blob): a miss."""
    if stores < 0:
        return NO_REPLAY
    try:
        flat = np.frombuffer(zlib.decompress(blob or b""), dtype=np.float32)
    except zlib.error:
        return False
    if flat.size != stores * FEATURE_WIDTH:
        return False
    return flat.reshape(stores, FEATURE_WIDTH)
