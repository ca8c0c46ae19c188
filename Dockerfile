# syntax=docker/dockerfile:1
# gpualloc: one image for every process (allocator, inventory, node agent, CLI); the command picks.
#
#   docker build -t gpualloc:dev .
#   docker run --rm -p 50051:50051 gpualloc:dev               # `gpualloc serve`: both services
#   docker run --rm gpualloc:dev gpualloc-allocator           # overrides need --entrypoint
#
# Stage 1 builds the wheel and installs it with its runtime dependencies into /opt/venv (extras:
# `agent` for NVML, `otlp` for OpenTelemetry export, `prometheus` for the /metrics endpoint,
# `kube` for the inventory's watch of the cluster's ResourceSlices); stage 2 copies only that venv onto a slim
# Python, so no compiler, pip cache or source tree ships.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependency metadata first, so editing code does not invalidate the dependency layer.
COPY pyproject.toml README.md constraints.txt ./
COPY protos ./protos
COPY services ./services
COPY loadtest ./loadtest
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --constraint constraints.txt "$(ls /dist/gpualloc-*.whl)[agent,otlp,prometheus,kube]" \
 && /opt/venv/bin/pip uninstall --yes pip \
 && /opt/venv/bin/python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpualloc" \
      org.opencontainers.image.description="GPU allocation-as-a-service over gRPC (Kubernetes DRA semantics)" \
      org.opencontainers.image.licenses="Apache-2.0"
# /certs: owned by the runtime user, so an empty named volume mounted there (docker compose's
# `certs` service writes its throwaway CA into one) takes that owner and is writable.
RUN groupadd --gid 10001 gpualloc \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpualloc \
 && install -d -o 10001 -g 10001 -m 0755 /certs
COPY --from=builder /opt/venv /opt/venv
# Read-only root filesystem friendly: bytecode was compiled at build time and nothing writes it
# now; Python's tempfile uses /tmp, which deployments mount as an emptyDir / tmpfs.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUALLOC_LISTEN=0.0.0.0:50051 \
    GPUALLOC_LOG_FORMAT=json
USER 10001:10001
EXPOSE 50051 50052
ENTRYPOINT ["gpualloc"]
CMD ["serve"]
