"""The staff dashboard: every tenant, resource, workflow, heartbeat and audit row, with guarded actions."""
