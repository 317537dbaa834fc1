"""What the control plane says to or reads from a tenant's instance.

- ``internal``: the instance-facing internal API (``/internal/v1/``: credential delivery, object keys, S3
  session credentials, heartbeats), authenticated by the instance token (``identity``). Its URLs are what
  ``agent_runtime`` calls; they never change.
- ``identity``: instance token verification, the instance actor, the heartbeat record.
- ``signals``: ``heartbeat_received``, for features above that act on a heartbeat (the inbox delivers to a
  ready instance at once) without this app importing them.
- ``client``: the signed instance client, how the features above call an instance's API (conversations, tasks,
  effect decisions, logs); it asks ``provisioning.selectors.instance_location`` where the instance listens.
- ``signing``: the control plane's side of the instance-API signature (pure functions, no I/O).
- ``runtime_tables``: the control plane's one reader of the runtime's own tables in a tenant's schema (boot
  records, tasks, steps, effects, the lease): the only module of the control plane that holds SQL naming them,
  checked by ``tests/test_runtime_tables_contract.py`` against agent_runtime's migrations. Pure: no Django, no
  control-plane app (import-linter).

A Django app without models: the instance rows stay ``provisioning.AgentInstance``; the heartbeat store stays
``provisioning.recovery.heartbeats`` (recovery and sleep sweeps read it; this app only writes to it).
"""
