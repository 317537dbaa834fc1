"""What the control plane says to a tenant's instance and hears from it over HTTP.

- ``internal``: the instance-facing internal API (``/internal/v1/``: credential delivery, object keys, S3
  session credentials, heartbeats), authenticated by the instance token (``identity``). Its URLs are what
  ``agent_runtime`` calls; they never change.
- ``identity``: instance token verification, the instance actor, the heartbeat record.
- ``signals``: ``heartbeat_received``, for features above that act on a heartbeat (the inbox delivers to a
  ready instance at once) without this app importing them.
- ``client``: the signed instance client, how the features above call an instance's API (conversations, tasks,
  effect decisions, logs); it asks ``provisioning.selectors.instance_location`` where the instance listens.
- ``signing``: the control plane's side of the instance-API signature (pure functions, no I/O).

What the control plane reads from the runtime's own tables in the tenant's schema is
``provisioning.resources.runtime_tables`` (one reader, a leaf every layer may use): provisioning's fleet jobs read
those tables too, and this app sits above provisioning, so the reader cannot live here without a circle.

A Django app without models: the instance rows stay ``provisioning.AgentInstance``; the heartbeat store stays
``provisioning.recovery.heartbeats`` (recovery and sleep sweeps read it; this app only writes to it).
"""
