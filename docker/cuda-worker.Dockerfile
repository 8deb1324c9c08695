# Nightshift CUDA worker: TVM runtime + measurement only, no compiler.
# Candidates are built on CPU workers (which need nvcc for CUDA targets); this image only
# loads the built .so bytes and times them on its GPU, so it starts Ray with --num-cpus 0
# and never receives a build.
# Build from the repository root:  docker build -f docker/cuda-worker.Dockerfile -t nightshift-cuda .
# The wheel's libtvm_runtime_cuda.so needs libcudart.so.13: a CUDA 13 runtime image (checked
# against the installed wheel by tests/measure/test_cuda_build.py). The driver (libcuda.so.1)
# comes from the host through the NVIDIA container toolkit: run with --gpus all.
FROM nvidia/cuda:13.0.1-runtime-ubuntu22.04

RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The wheel ships the compiler (libtvm_compiler.so, ~259 MB of its 305 MB); delete it and
# import TVM runtime-only. Pins as in pyproject.toml.
RUN pip install --no-cache-dir "apache-tvm==0.27.0.post1" "apache-tvm-ffi==0.1.14.post1" "numpy>=1.26" \
        "ray[default]==2.60.0" "psutil>=5.9" \
    && rm -f /opt/venv/lib/python3.11/site-packages/tvm/lib/libtvm_compiler.so
ENV TVM_USE_RUNTIME_LIB=1

RUN useradd --create-home --uid 1000 nightshift
WORKDIR /opt/nightshift
# Only the measuring side of Nightshift; --no-deps keeps XGBoost, Optuna, SQLAlchemy out.
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY search_spaces ./search_spaces
COPY cost_models ./cost_models
RUN pip install --no-cache-dir --no-deps .

USER nightshift
ENV RAY_HEAD=ray-head:6380
# One nightshift_cuda_<sm_XX> resource and one Ray GPU per GPU, found with the runtime alone
# (the worker loads libtvm_runtime_cuda itself: TVM_USE_RUNTIME_LIB=1 leaves it out).
CMD ["sh", "-c", "exec python -m tuner.measure.worker --address \"$RAY_HEAD\" --num-cpus 0 --no-cpu-device --block"]
