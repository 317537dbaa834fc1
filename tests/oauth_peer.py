"""The connections tests' OAuth 2.0 authorization server: ``examples/agent_examples/peers/oauth.py`` (Authlib), the
demo's example provider too. Loaded from this checkout's file, not through the installed ``agent_examples``: that
editable install may point at another checkout of the repository."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "agent_examples.peers.oauth"
_FILE = Path(__file__).resolve().parent.parent / "examples" / "agent_examples" / "peers" / "oauth.py"
_spec = importlib.util.spec_from_file_location("tests._oauth_server", _FILE)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module  # dataclasses look their module up by name
_spec.loader.exec_module(_module)

OAuthPeer = _module.OAuthPeer
_RefreshToken = _module._RefreshToken

__all__ = ["OAuthPeer"]
