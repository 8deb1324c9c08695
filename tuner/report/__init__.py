"""The morning after a job: what the database says about it, as an HTML page and a job list."""

from __future__ import annotations

from tuner.report.data import DEAD_AFTER, JobData, JobInfo, find_job, job_data, list_jobs
from tuner.report.html import render

__all__ = ["DEAD_AFTER", "JobData", "JobInfo", "find_job", "job_data", "list_jobs", "render"]
