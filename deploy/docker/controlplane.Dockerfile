# Control plane image: Django web (gunicorn), Celery worker and beat, migrations - one image, four commands.
# Build from the repository root:  docker build -f deploy/docker/controlplane.Dockerfile -t agent-control-plane .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=controlplane.settings \
    CONTROLPLANE_VAR_DIR=/tmp/var \
    DB_CONN_MAX_AGE=60

WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml ./
RUN mkdir -p controlplane tenants vault provisioning dashboard portal branding conversations webhooks instances \
    agent_runtime \
    && pip install . "gunicorn>=23,<28" \
    && pip uninstall -y agent-control-plane
COPY manage.py ./
COPY templates ./templates
COPY controlplane ./controlplane
COPY tenants ./tenants
COPY vault ./vault
COPY provisioning ./provisioning
COPY dashboard ./dashboard
COPY portal ./portal
COPY branding ./branding
COPY conversations ./conversations
COPY webhooks ./webhooks
COPY releases ./releases
COPY instances ./instances
COPY schedules ./schedules
COPY mcp_servers ./mcp_servers
COPY egress ./egress
COPY connections ./connections
COPY usage ./usage
COPY agent_runtime ./agent_runtime
COPY deploy/gunicorn.conf.py ./gunicorn.conf.py
RUN pip install --no-deps . \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin app \
    && mkdir -p /var/lib/agent && chown 10001:10001 /var/lib/agent

# Runs read-only in Kubernetes: everything written goes to /tmp (an emptyDir there).
USER 10001:10001
EXPOSE 8000
# Timeouts and request limits for slow or hostile clients: gunicorn.conf.py (deploy/gunicorn.conf.py).
CMD ["gunicorn", "--config", "/app/gunicorn.conf.py", "controlplane.wsgi:application"]
