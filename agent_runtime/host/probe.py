"""``python -m agent_runtime.host.probe --path DIR``: which agent kinds the distributions installed in DIR provide.

The control plane validates an uploaded release by installing its wheel into a directory of its own and
running this in a separate process (with a timeout): the package must import and every entry point in the
group ``agent_runtime.agents`` must name an agent, by the same rules ``agent-host`` applies at boot. Only the
distributions in DIR count; the runtime's own environment supplies their dependencies.

Prints one JSON object and exits 0 (``{"distribution", "version", "kinds": {kind: description},
"config_schemas": {kind: JSON Schema}, "connections": {kind: [provider, ...]}, "egress": {kind: [host, ...]}}``,
only the kinds that declare ``config_schema`` / ``connections`` / ``egress``) or 2 (``{"error": "..."}``, the cause
in one sentence). Merging the schemas into the release's one is the control plane's job.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from typing import Any

from ..errors import AgentLoadError
from ..sdk.agent import check_config_schema, check_connections, check_egress
from .loader import ENTRY_POINT_GROUP, _agents_in


def probe(path: str) -> dict[str, Any]:
    dists = list(metadata.distributions(path=[path]))
    if len(dists) != 1:
        raise AgentLoadError(f"the release must install exactly one distribution (found {len(dists)})")
    dist = dists[0]
    name = dist.metadata["Name"]
    points = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    if not points:
        raise AgentLoadError(f"{name} declares no entry point in the group {ENTRY_POINT_GROUP!r}, so it provides "
                             "no agent kind (see docs/sdk.md)")
    kinds: dict[str, str] = {}
    schemas: dict[str, Any] = {}
    connections: dict[str, list[str]] = {}
    egress: dict[str, list[str]] = {}
    for ep in sorted(points, key=lambda e: e.name):
        source = f"{name} (entry point '{ep.name} = {ep.value}')"
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is the release's, reported by cause
            raise AgentLoadError(f"{source}: failed to import: {type(exc).__name__}: {exc}"[:500]) from exc
        for agent in _agents_in(obj, source):
            if agent.kind in kinds:
                raise AgentLoadError(f"{source}: the kind {agent.kind!r} is declared twice")
            kinds[agent.kind] = str(getattr(agent, "description", "") or "")
            schema = getattr(agent, "config_schema", None)
            if schema is not None:
                try:
                    schemas[agent.kind] = json.loads(json.dumps(check_config_schema(schema)))
                except (TypeError, ValueError) as exc:
                    raise AgentLoadError(f"{source}: the config_schema of {agent.kind!r} is not a JSON object "
                                         f"schema: {exc}"[:500]) from exc
            try:
                declared = check_connections(getattr(agent, "connections", None))
            except ValueError as exc:
                raise AgentLoadError(f"{source}: the connections of {agent.kind!r}: {exc}"[:500]) from exc
            if declared:
                connections[agent.kind] = list(declared)
            try:
                hosts = check_egress(getattr(agent, "egress", None))
            except ValueError as exc:
                raise AgentLoadError(f"{source}: the egress of {agent.kind!r}: {exc}"[:500]) from exc
            if hosts:
                egress[agent.kind] = list(hosts)
    return {"distribution": name, "version": dist.version, "kinds": kinds, "config_schemas": schemas,
            "connections": connections, "egress": egress}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_runtime.host.probe")
    parser.add_argument("--path", required=True, help="the directory the release's wheel was installed into")
    args = parser.parse_args(argv)
    sys.path.insert(0, args.path)
    try:
        print(json.dumps(probe(args.path)))
    except AgentLoadError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
