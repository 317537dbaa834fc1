"""Gunicorn settings for the control plane's web tier (used by the image, compose and Kubernetes).

Threaded workers (gthread, see controlplane/gunicorn_worker.py): a conversation's reply stream (server-sent
events, up to a minute or more) holds one thread, not a whole worker; a client that sends its request slowly
(slowloris) or never finishes is cut off after ``timeout`` seconds of silence on its socket. Each thread keeps
its database connection for DB_CONN_MAX_AGE seconds (the image sets 60). Other bounds: a worker silent for
``timeout`` seconds is killed and replaced; idle keep-alive connections close after ``keepalive``; request lines
and headers are size-limited before Django sees them (bodies: DATA_UPLOAD_MAX_MEMORY_SIZE).
In production put a buffering proxy (the ingress) in front as well: it absorbs slow clients entirely.
Every value can be overridden with GUNICORN_* variables (or GUNICORN_CMD_ARGS).

``GUNICORN_SERVER=asgi``: the reply-stream tier instead (controlplane/asgi.py; docs/production.md "Reply
streams"): uvicorn workers, each relaying thousands of reply streams on its event loop, no thread per stream.
``wsgi_app`` is the app when the command names none; a command that names one must name the server's
(``controlplane.asgi:application`` with ``asgi``: uvicorn would run a WSGI app in a thread pool).
"""

import os

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "3"))
server = os.environ.get("GUNICORN_SERVER", "gthread")
if server not in ("gthread", "asgi"):
    raise SystemExit(f"GUNICORN_SERVER must be gthread or asgi, not {server!r}")
if server == "asgi":
    worker_class = "uvicorn.workers.UvicornWorker"
    wsgi_app = "controlplane.asgi:application"
else:
    worker_class = "controlplane.gunicorn_worker.TimedThreadWorker"  # gthread + a per-socket time limit
    wsgi_app = "controlplane.wsgi:application"
threads = int(os.environ.get("GUNICORN_THREADS", "16"))
worker_tmp_dir = os.environ.get("GUNICORN_WORKER_TMP_DIR", "/tmp")  # noqa: S108 - an emptyDir in Kubernetes
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "2000"))
max_requests_jitter = 200
accesslog = "-"
forwarded_allow_ips = os.environ.get("GUNICORN_FORWARDED_ALLOW_IPS", "127.0.0.1")
