"""Operator branding: validation and sanitizing, versioned content-hashed themes, resumable rollout."""
