# rsub sidecar image: the wheels of rsub and of exactly the versions constraints.txt pins,
# built outside (scripts/image_tool.py), installed with no index and so no network; a slim
# non-root runtime.
#   python scripts/image_tool.py wheels && docker build -t rsub-sidecar:0.1.0 .
#   make image   # the same with podman, from a Debian base made by mmdebstrap (no registry)
# Pin the base image by digest in production: --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...
# Its Python must be the minor version the wheels were built with (3.11).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY constraints.txt /wheels/constraints.txt
COPY dist/image-wheels /wheels
# --no-index: only the wheels given, each at its pinned version (-c); grpcio, protobuf and
# uvloop are manylinux wheels, so no compiler.
RUN python -m venv /opt/rsub \
    && /opt/rsub/bin/pip install --no-index --find-links /wheels \
       -c /wheels/constraints.txt /wheels/rsub-*.whl

FROM ${PYTHON_IMAGE} AS runtime
ARG RSUB_UID=10001
LABEL org.opencontainers.image.title="rsub-sidecar" \
      org.opencontainers.image.description="Replicated subscriptions for NATS JetStream" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid "${RSUB_UID}" rsub \
    && useradd --system --no-log-init --uid "${RSUB_UID}" --gid rsub \
       --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin rsub
COPY --from=builder /opt/rsub /opt/rsub
ENV PATH=/opt/rsub/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER ${RSUB_UID}:${RSUB_UID}
EXPOSE 7070 8080
# Liveness of the event loop via /healthz; the port follows RSUB_HTTP__LISTEN when it is set.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('RSUB_HTTP__LISTEN', ':8080').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=3)"]
ENTRYPOINT ["rsub", "run"]
CMD ["--config", "/etc/rsub/sidecar.yaml"]
