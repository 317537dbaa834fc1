#!/usr/bin/env python
"""Django's command-line utility for administrative tasks.

A dependency that is not there (a DATABASE_URL pointing at nothing, a broker that is down, a setting that
is wrong) is one sentence first: what failed, where, how to fix it. The traceback only with ``--verbose``
(or Django's own ``--traceback``), because 170 lines with the cause at the bottom help nobody.
"""

import os
import sys

VERBOSE_FLAGS = ("--verbose", "--traceback")


def _explain(exc: BaseException) -> str | None:
    """One sentence for the configuration and dependency errors a newcomer meets; None for anything else."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import OperationalError as DatabaseOperationalError

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if isinstance(exc, DatabaseOperationalError):
        return (f"cannot use the database ({first}): check that the server named by DATABASE_URL runs and that "
                "the URL, user and password are right, or unset DATABASE_URL for the embedded PostgreSQL")
    if isinstance(exc, ImproperlyConfigured):
        return f"the configuration is not usable: {str(exc).strip()}"  # whole: it may list every problem
    try:
        from kombu.exceptions import OperationalError as BrokerOperationalError
    except ImportError:  # pragma: no cover - kombu is a dependency
        return None
    if isinstance(exc, BrokerOperationalError):
        return (f"cannot reach the message broker ({first}): check that the server named by CELERY_BROKER_URL "
                "runs, or unset it for the embedded default's own Redis")
    return None


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    verbose = any(flag in sys.argv for flag in VERBOSE_FLAGS)
    argv = [arg for arg in sys.argv if arg != "--verbose"]
    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(argv)
    except Exception as exc:
        sentence = None if verbose else _explain(exc)
        if sentence is None:
            raise
        sys.stderr.write(f"error: {sentence}\n(run again with --verbose for the traceback)\n")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
