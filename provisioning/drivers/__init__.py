"""Drivers for per-tenant resources. Every driver has one shape: ensure / observe / delete.

``registry.drivers_for_profile`` picks the set for ``PROVISIONING_PROFILE``; workflows
never branch on the profile.
"""
