"""Talking to a tenant's agent through the control plane: the durable inbox, the signed client of the
instance API (docs/instance-api.md), customer tokens and the tenant-scoped conversation/task API.

The control plane never imports agent code: the instance is reached over HTTP only.
"""
