"""A template's start points (oneDNN's register tiles for the dense dot templates) are
measured in a real job's first batches, whatever the search would have drawn."""

from __future__ import annotations

import json

import pytest
from job_tasks import dense_bf16_task

from tuner.db import TuningDatabase
from tuner.device import host_cpu_info
from tuner.job import TuneConfig, TuningJob, record_point

pytestmark = pytest.mark.skipif("avx512_bf16" not in host_cpu_info()["isa_flags"],
                                reason="this CPU has no AVX512_BF16")  # fmt: skip


def test_a_job_measures_the_template_starts_first(cpu_device, tmp_path):
    from search_spaces.template_space import TemplateSpace

    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    task = dense_bf16_task()
    space = TemplateSpace(task.mod, cpu_device.target, "x86-dense-bf16")
    starts = {record_point("x86-dense-bf16", p) for p in space.starts()}
    assert len(starts) == 3
    job = TuningJob([task], cpu_device, db, TuneConfig(trials=8, batch_size=4, name="starts", measurer="inline"),
                    model_name="m")
    job.run()
    measured = db.measured_points(task.workload_key, db.device_id(cpu_device), job.timing)
    assert starts <= {p for p in measured if json.loads(p)["kind"] == "x86-dense-bf16"}, (starts, measured)
