"""Model weights on 4 KiB pages: numpy's huge-page advice kept away from TVM's buffers.

numpy advises transparent huge pages (``madvise(MADV_HUGEPAGE)``) for every array of 4 MiB
or more. A model's weights pass through numpy on their way into TVM (the zoo's random
weights, ONNX initializers, ``tuner.graph.fold``, the packed layouts), and when those arrays are
freed their address ranges keep the advice, which TVM's allocations can reuse; ``khugepaged``
then moves what lies there onto 2 MiB pages a few seconds into a run (with the advice off, a
process that compiles and runs a model holds no huge page at all; which of its buffers held
them was not traced). On 2 MiB pages the tuned convs are slower: on a 2-core Zen 4 a tuned ResNet-50
with huge pages for every allocation never ran under 43.2 ms, against 38.3-39.2 ms minima on
4 KiB pages, while OpenVINO f32 (``INFERENCE_PRECISION_HINT`` f32) moved by 2-3% (``benchmarks/paired_series.py``;
benchmarks/README.md, "The three models with today's code on a Zen 4"). Processes that build
and run compiled models call :func:`small_pages` before the first weight exists.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def small_pages() -> None:
    """Stop numpy from advising huge pages for its large arrays in this process (idempotent).

    Arrays allocated before the call keep their advice, and so does their memory after they
    are freed: one that glibc placed in its heap leaves that heap range advised, and later
    allocations reuse it (in a test session that had run the bench tests, a new 64 MiB array
    came from such a range). So call it before a model's weights are made. Only numpy's own
    advice changes: other libraries' allocations and the system's transparent-huge-page
    setting are left as they are.
    """
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore[no-redef]
    if _set_madvise_hugepage(False):
        logger.debug("numpy's huge-page advice turned off for this process")
