"""SCRAM-SHA-256 password verifiers computed client-side (RFC 5802 / 7677), as PostgreSQL stores them.

Sending the verifier instead of the password means the plaintext never reaches the
server, its statement log or pg_stat_statements. Used for the embedded server's superuser
(``embedded_pg``) and for every tenant role (``provisioning/drivers/postgres_schema.py``); pure, no Django.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["scram_sha256_verifier"]


def scram_sha256_verifier(password: str, *, iterations: int = 4096, salt: bytes | None = None) -> str:
    salt = salt or os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"
