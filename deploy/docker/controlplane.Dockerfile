# Control plane image: Django web (gunicorn), Celery worker and beat, migrations - one image, four commands.
# Build from the repository root:  docker build -f deploy/docker/controlplane.Dockerfile -t agent-control-plane .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=controlplane.settings \
    CONTROLPLANE_VAR_DIR=/tmp/var

WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml ./
RUN mkdir -p controlplane tenants vault provisioning agent_runtime \
    && pip install . "gunicorn>=22,<24" \
    && pip uninstall -y agent-control-plane
COPY manage.py ./
COPY templates ./templates
COPY controlplane ./controlplane
COPY tenants ./tenants
COPY vault ./vault
COPY provisioning ./provisioning
COPY agent_runtime ./agent_runtime
RUN pip install --no-deps . \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin app \
    && mkdir -p /var/lib/agent && chown 10001:10001 /var/lib/agent

# Runs read-only in Kubernetes: everything written goes to /tmp (an emptyDir there).
USER 10001:10001
EXPOSE 8000
CMD ["gunicorn", "controlplane.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", \
     "--worker-tmp-dir", "/tmp", "--access-logfile", "-"]
