# Data-plane image: one tenant's agent-host. It reads only AGENT_* / AWS_* variables (the tenant Secret)
# and writes only to its volume (AGENT_VOLUME) and /tmp; the root filesystem is read-only at run time.
# Build from the repository root:  docker build -f deploy/docker/agent-host.Dockerfile -t agent-host .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    TMPDIR=/tmp

WORKDIR /app
COPY pyproject.toml ./
RUN mkdir -p controlplane tenants vault provisioning agent_runtime \
    && pip install . \
    && pip uninstall -y agent-control-plane
COPY agent_runtime ./agent_runtime
COPY controlplane ./controlplane
COPY tenants ./tenants
COPY vault ./vault
COPY provisioning ./provisioning
RUN pip install --no-deps . \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin agent

USER 10001:10001
EXPOSE 8080
# The StatefulSet sets AGENT_HTTP_HOST=0.0.0.0 and AGENT_HTTP_PORT=8080 (probes: /healthz, /readyz).
ENTRYPOINT ["agent-host"]
