"""Adapters between the runtime and libraries agent authors already use (an OpenAI-compatible chat client)."""
