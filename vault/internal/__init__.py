"""Internal endpoints for agent instances (instance-token auth): credential delivery, object keys, heartbeat."""
