"""A job's starting cost model: the closest knowledge there is, in order: the database's records
of the device family, a model stored in the database, the model shipped in the package."""

from __future__ import annotations

import logging
import time

import tvm

from cost_models.base import CostModel
from cost_models.dataset import load_dataset
from cost_models.features import FEATURE_WIDTH
from cost_models.pretrained import shipped_model

logger = logging.getLogger(__name__)


def pretrain(db, device, *, kind: str = "xgb", seed: int = 0, target: tvm.target.Target | None = None,
             same_arch: bool = True, max_records: int | None = 5_000) -> CostModel:  # fmt: skip
    """The cost model a job on ``device`` starts with.

    Trains on every usable record of the device's family in ``db`` (this device and, with
    ``same_arch``, every device of the same kind and architecture; all workloads, since the
    model is shared across tasks), rebuilding features by replaying each stored trace.
    Without such records, loads the newest stored model of ``kind`` for the family; without
    one (or one of another feature layout), the model shipped in the package for the
    device's kind (:mod:`cost_models.pretrained`). Without any, returns an untrained model
    (it predicts zeros, so the job explores at random). A loaded model is fine-tuned as the
    job measures: its ``update`` adds trees on top of the loaded ones.

    The job should pass each task's workload key as its ``groups`` in later ``update``
    calls, so its measurements join the pre-training records of the same task.

    Args:
        db: a :class:`tuner.db.TuningDatabase`.
        device: the :class:`tuner.device.Device` being tuned.
        kind: cost model name for :func:`cost_models.create`.
        seed: the model's seed.
        target: target for feature extraction; ``device.target`` by default.
        same_arch: use the family's records and models, not only this device's.
        max_records: newest records used at most: rebuilding features takes ~20 ms a record
            on a busy 2-core machine (1,024 records in 20 s), after TVM's one-time import of
            its tensor intrinsics.

    Returns:
        The model; ``model.num_samples`` says how much it learned before the job.
    """
    from cost_models.registry import create

    start = time.perf_counter()
    model = create(kind, seed=seed)
    data = load_dataset(db, device, target=target, same_arch=same_arch, max_records=max_records)
    if len(data):
        model.fit(data.features, data.throughputs, data.groups)
        logger.info("cost model %s pre-trained on %d records of %d tasks in %.1f s", kind, len(data),
                    len(set(data.groups.tolist())), time.perf_counter() - start)  # fmt: skip
        return model
    dev_id = db.find_device_id(device)
    stored = db.load_cost_model(dev_id, kind, same_arch=same_arch) if dev_id is not None else None
    for origin, blob in (("the database", stored), ("the package", lambda: shipped_model(device.kind, kind))):
        blob = blob() if callable(blob) else blob
        if blob and _load(model, blob, origin, kind):
            return model
    return model


def _load(model: CostModel, blob: bytes, origin: str, kind: str) -> bool:
    """Load ``blob`` into ``model`` if it reads today's features; say which and why not."""
    try:
        model.load(blob)
    except ValueError as err:
        logger.warning("cost model %s from %s does not load (%s)", kind, origin, err)
        return False
    width = getattr(model, "num_features", None)
    if width is not None and width != FEATURE_WIDTH:
        # A model of an older feature layout (before the hardware descriptor) would
        # misread every column.
        logger.info("cost model %s from %s reads %d features, not %d; not used", kind, origin, width, FEATURE_WIDTH)
        model.load(b"")
        return False
    logger.info("cost model %s loaded from %s (trained on %d samples)", kind, origin, model.num_samples)
    return True
