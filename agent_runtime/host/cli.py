"""The `agent-host` command line: run the instance (no arguments), `submit` a task, `dev` (the author's loop on
a source directory, `agent_runtime.host.dev`), or `--help`.

`agent-host --help` prints every environment variable the host reads (from `config.ENVIRONMENT`), because
the host is configured by its environment alone: that is what the control plane's drivers set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from agent_runtime.db import check_schema_name, connect
from agent_runtime.errors import ConfigError
from agent_runtime.host.config import ENVIRONMENT, HostConfig
from agent_runtime.host.dev import dev_main
from agent_runtime.host.logs import setup_json_logging
from agent_runtime.host.process import EXIT_CONFIG, Host
from agent_runtime.state import tasks as task_store
from agent_runtime.state.migrations import migrate

__all__ = ["main"]

USAGE = """agent-host                                   run this tenant's agent instance (configured by environment)
agent-host submit --kind KIND [--params JSON] enqueue a task in the tenant's schema, print its id
agent-host dev PATH [--submit KIND JSON --wait] run a package from its source on a local instance (dev --help)
agent-host --help                            this text"""


def _help_text() -> str:
    width = max(len(name) for name, _d, _m in ENVIRONMENT)
    rows = "\n".join(f"  {name:<{width}}  {meaning} [default: {default}]" if default else
                     f"  {name:<{width}}  {meaning}" for name, default, meaning in ENVIRONMENT)
    return (f"usage:\n{USAGE}\n\nThe instance runs the agents of the installed package (entry points in the group "
            f"'agent_runtime.agents', or AGENT_APP) and keeps their state durable; see docs/sdk.md.\n\n"
            f"environment:\n{rows}\n\nexit codes: 0 clean stop, 2 configuration error, 3 another host holds the "
            f"schema, 4 schema newer than this runtime\n")


def submit_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent-host submit", description="Enqueue a task durably.")
    parser.add_argument("--kind", required=True)
    parser.add_argument("--params", default="{}", help="task parameters as a JSON object")
    args = parser.parse_args(argv)
    try:
        params = json.loads(args.params)
        if not isinstance(params, dict):
            raise ValueError("--params must be a JSON object")
        dsn, schema = os.environ["AGENT_DATABASE_URL"], check_schema_name(os.environ["AGENT_SCHEMA"])
    except KeyError as exc:
        print(f"agent-host submit: {exc.args[0]} is required", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:
        print(f"agent-host submit: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # Through a transaction pooler the startup options (search_path) are refused: the same switch as the host's.
    pooled = os.environ.get("AGENT_DATABASE_POOLED", "0") in ("1", "true", "yes")
    with connect(dsn, schema, autocommit=True, pooled=pooled) as conn:
        migrate(conn, schema)
        print(task_store.submit(conn, args.kind, params))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help", "help"):
        print(_help_text(), end="")
        return 0
    if argv and argv[0] == "submit":
        return submit_main(argv[1:])
    if argv and argv[0] == "dev":
        return dev_main(argv[1:])
    if argv:
        print(f"agent-host: unknown arguments {argv!r}\n\nusage:\n{USAGE}", file=sys.stderr)
        return EXIT_CONFIG
    setup_json_logging()
    try:
        cfg = HostConfig.from_env()
    except ConfigError as exc:
        print(f"agent-host: configuration error: {exc} (agent-host --help lists the variables)", file=sys.stderr)
        return EXIT_CONFIG
    from agent_runtime.host.tracing import setup_tracing

    setup_tracing(os.environ, tenant_id=cfg.tenant_id, release=cfg.release_version)
    return Host(cfg).run()
