# syntax=docker/dockerfile:1
# gpu-exporter image: docker build -t gpu-exporter:0.1.0 .
#
# Two stages on the same slim Python base. The builder turns the project into a wheel and
# installs it, with dependencies pinned in deploy/image/*.txt (generated from pyproject.toml by
# deploy/image/lock.py), into a virtual environment; wheels only, so no compiler is needed in either
# stage. The final stage copies that environment and nothing else. Pin PYTHON_IMAGE to a digest
# for releases (--build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...).
#
# The image runs as UID 65532, which is enough for NVML and the simulator. The DaemonSet runs it
# as UID 0 with every capability dropped but CAP_SYSLOG, because the kubelet's pod-resources
# socket, the state directory and CAP_SYSLOG need it (docs/deploy.md, "Security").
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ONLY_BINARY=:all:
WORKDIR /src
# Dependencies first: this layer is rebuilt only when the pins change.
COPY deploy/image/requirements.txt deploy/image/build-requirements.txt ./
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --no-deps -r build-requirements.txt \
    && python -m venv --without-pip /opt/gpu-exporter \
    && /opt/build/bin/pip --python /opt/gpu-exporter/bin/python install --no-deps -r requirements.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/build/bin/pip --python /opt/gpu-exporter/bin/python install --no-deps /wheels/*.whl \
    && /opt/gpu-exporter/bin/python -m compileall -q /opt/gpu-exporter \
    && /opt/gpu-exporter/bin/gpu-exporter --version

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs: activity, health, Xids and per-pod allocation" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpu-exporter/gpu-exporter" \
      org.opencontainers.image.documentation="https://github.com/gpu-exporter/gpu-exporter/blob/main/docs/deploy.md"
COPY --from=builder /opt/gpu-exporter /opt/gpu-exporter
# MALLOC_ARENA_MAX=2: the exporter's threads share two glibc malloc arenas instead of one each
# (docs/deploy.md, "Resources"); the DaemonSet sets it too, for images built otherwise.
ENV PATH=/opt/gpu-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65532:65532
EXPOSE 9445
ENTRYPOINT ["gpu-exporter"]
