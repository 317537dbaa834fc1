"""Resumable provisioning workflows: which steps each kind runs (``plans``), the engine that runs them on the job
kernel (``engine``), the onboarding/deprovisioning steps (``steps``) and the entry points that start a tenant's
onboarding or deprovisioning (``onboarding``).

Recovery's own steps are ``provisioning.recovery.steps``; a database move's are ``provisioning.databases.move``.
"""
