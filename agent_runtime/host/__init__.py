"""The `agent-host` process (`process`), its configuration (`config`), agent discovery (`loader`), the step
machinery (`runner`), credentials, logs and the progress marker. `main` is the console entry point.

Imported lazily: the SDK imports pieces of this package (credentials), and the process imports the SDK.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from agent_runtime.host.cli import main as cli_main

    return cli_main(argv)
