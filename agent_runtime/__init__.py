"""agent_runtime: the data plane that lives inside each tenant's agent instance.

Each kind of agent state is kept where it belongs, in the tenant's own PostgreSQL schema, object-store
prefix and volume: conversation memory (`memory`), task checkpoints (`checkpoints`), tool outputs
(`toolcache`), semantic memory (`semantic`), working files (`workspace`), the effect ledger (`ledger`)
and artifact-bound judgments (`judgments`). `host` is the `agent-host` process that reads all of it back
before acting. This package never imports Django or the control plane.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
