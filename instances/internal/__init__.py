"""Internal endpoints for agent instances (instance-token auth): credential delivery, object keys, S3
session credential renewal, heartbeat."""
