"""Measurement: builds as Ray tasks on any CPU, timing and verification on a device actor.

Kept free of imports so that a runtime-only worker (TVM runtime, no compiler) can import
``tuner.measure.runner`` without pulling in the compiler side.
"""
