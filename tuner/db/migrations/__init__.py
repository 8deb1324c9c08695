"""Alembic migrations of the tuning database, shipped as package data.

Run through :mod:`tuner.db.migrate` (``nightshift db init|upgrade``), never with a separate
``alembic.ini``: the connection comes from Nightshift's own engine.
"""
