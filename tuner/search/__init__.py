"""The search loop's parts: which task gets the next trials, and which points to try."""

from tuner.search.scheduler import NoTaskAvailable, TaskScheduler
from tuner.search.strategy import ModelGuidedSampler

__all__ = ["ModelGuidedSampler", "NoTaskAvailable", "TaskScheduler"]
