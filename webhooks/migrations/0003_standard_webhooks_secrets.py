"""Endpoint secrets made before Standard Webhooks signing, rewritten in Standard Webhooks form, same HMAC key.

Such a secret was ``whsec_`` + 43 URL-safe characters (``secrets.token_urlsafe(32)``), used whole as UTF-8 as
the HMAC key; its tail is not standard base64, so no Standard Webhooks library reads it as we meant. Each
becomes ``whsec_`` + base64(the old secret): decoded, that is the very key the endpoint always had, so the
operator's copy converts offline (docs/webhooks.md, "Upgrading a receiver") and nothing has to be re-issued.
The hint is recomputed, so a converted copy can be checked against it. Secrets made by ``new_secret`` since
(44 characters with ``=``) never match the old shape, so running this twice changes nothing.

Unwrapping needs the key ring that wrapped the secrets: with another one the migration stops (nothing is half
converted: it runs in one transaction).
"""

import base64
import re

from django.db import migrations

_LEGACY = re.compile(r"^whsec_[A-Za-z0-9_-]{43}$")


def _context(endpoint) -> str:
    return f"webhook-endpoint:{endpoint.pk}"  # as webhooks.services._secret_context binds it


def _convert(apps, change) -> None:
    WebhookEndpoint = apps.get_model("webhooks", "WebhookEndpoint")
    endpoints = list(WebhookEndpoint.objects.order_by("pk"))
    if not endpoints:
        return  # a fresh database: no key ring is asked for
    # Here, not at the top: every migrate loads this module; only a database with secrets to convert needs today's
    # vault code (a migration otherwise sees only historical models).
    from vault.kek import WrappedKey, kek_provider, kek_unwrap

    provider = kek_provider()
    for endpoint in endpoints:
        wrapped = WrappedKey(endpoint.secret_kek_id, bytes(endpoint.secret_blob), endpoint.secret_fingerprint or None)
        new = change(kek_unwrap(_context(endpoint), wrapped).decode())
        if new is None:
            continue
        rewrapped = provider.wrap(_context(endpoint), new.encode())
        endpoint.secret_kek_id, endpoint.secret_blob = rewrapped.kek_id, rewrapped.blob
        endpoint.secret_fingerprint = rewrapped.fingerprint or ""
        endpoint.secret_hint = f"whsec_…{new[-4:]}"
        endpoint.save(update_fields=["secret_kek_id", "secret_blob", "secret_fingerprint", "secret_hint"])


def _to_standard(secret: str) -> str | None:
    return "whsec_" + base64.b64encode(secret.encode()).decode() if _LEGACY.match(secret) else None


def _to_legacy(secret: str) -> str | None:
    try:
        old = base64.b64decode(secret.removeprefix("whsec_"), validate=True).decode()
    except ValueError:
        return None
    return old if _LEGACY.match(old) else None


def forwards(apps, schema_editor) -> None:
    _convert(apps, _to_standard)


def backwards(apps, schema_editor) -> None:
    _convert(apps, _to_legacy)


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0002_schedules")]
    operations = [migrations.RunPython(forwards, backwards)]
