# Nightshift CPU worker: builds candidates (TVM compiler, LLVM) and times CPU candidates.
# Build from the repository root:  docker build -f docker/cpu-worker.Dockerfile -t nightshift-cpu .
FROM python:3.11-slim-bookworm

# export_library links each candidate into a .so with the system C++ toolchain.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ libgomp1 \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 nightshift
WORKDIR /opt/nightshift

COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY search_spaces ./search_spaces
COPY cost_models ./cost_models
# Ray, TVM and their versions come pinned from pyproject.toml: the same in every image.
RUN pip install --no-cache-dir '.[postgres]'

USER nightshift
ENV RAY_HEAD=ray-head:6380
# Offers this machine's CPUs for builds and its CPU device resource (nightshift_cpu_<mcpu>).
CMD ["sh", "-c", "exec python -m tuner.measure.worker --address \"$RAY_HEAD\" --block"]
