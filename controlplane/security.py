"""Security helpers for settings and every response: the production-settings check and the CSP header.

``production_settings_problems`` is pure (no Django import, no I/O beyond reading the development
secret files it compares against), so ``settings.py`` can call it before Django is configured.
Nothing here decides who may do what: that is authentication, permissions and selectors.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .config_table import fault_injection_problems
from .secretfiles import DEV_KEYRING_FILE, DEV_SECRET_KEY_FILE

__all__ = ["production_settings_problems", "ContentSecurityPolicyMiddleware", "RejectNulBytesMiddleware"]

_DEV_SECRET_FILES = {"SECRET_KEY": DEV_SECRET_KEY_FILE, "VAULT_KEK_KEYRING": DEV_KEYRING_FILE}


def _same_as_dev_file(value: str, var_dir: Path, name: str) -> bool:
    path = var_dir / "secrets" / name
    try:
        dev = path.read_text().strip()
    except OSError:
        return False
    return bool(dev) and hmac.compare_digest(dev.encode(), value.strip().encode())


def production_settings_problems(
    *, environ: Mapping[str, str], debug: bool, var_dir: Path, kek_provider: str, broker_url: str,
) -> list[str]:
    """Everything that makes this environment unfit for production, as messages that name no secret."""
    problems = []
    if debug:
        problems.append("DEBUG must be off")
    secret_key = environ.get("SECRET_KEY", "")
    if not secret_key:
        problems.append("SECRET_KEY must be set in the environment (the generated development key is refused)")
    elif _same_as_dev_file(secret_key, var_dir, _DEV_SECRET_FILES["SECRET_KEY"]):
        problems.append("SECRET_KEY is the generated development key")
    elif len(secret_key) < 50 or len(set(secret_key)) < 5 or secret_key.startswith("django-insecure-"):
        problems.append("SECRET_KEY must be at least 50 random characters")
    if kek_provider == "local":
        ring = environ.get("VAULT_KEK_KEYRING", "")
        if not ring:
            problems.append("VAULT_KEK_KEYRING must be set in the environment (the generated development "
                            "key ring is refused), or use VAULT_KEK_PROVIDER=aws-kms")
        elif _same_as_dev_file(ring, var_dir, _DEV_SECRET_FILES["VAULT_KEK_KEYRING"]):
            problems.append("VAULT_KEK_KEYRING is the generated development key ring")
    elif kek_provider == "aws-kms" and not environ.get("VAULT_KMS_KEY_ID"):
        problems.append("VAULT_KMS_KEY_ID must be set when VAULT_KEK_PROVIDER=aws-kms")
    if not environ.get("DATABASE_URL"):
        problems.append("DATABASE_URL must be set (the embedded PostgreSQL is for development)")
    if broker_url.startswith("filesystem://"):
        problems.append("CELERY_BROKER_URL must name a real broker (the filesystem broker is for development)")
    elif str(var_dir) in broker_url:
        problems.append("CELERY_BROKER_URL must be set (the embedded Redis under var/ is for development)")
    local_profile = environ.get("PROVISIONING_PROFILE", "local") == "local"
    if local_profile and environ.get("LOCAL_INSTANCE_ISOLATION", "auto") == "off":
        problems.append("LOCAL_INSTANCE_ISOLATION=off is refused: every local instance needs its own user and sandbox")
    # Several machines serve one control plane (docs/production.md): what one writes, every other must read.
    if environ.get("CONTROLPLANE_OBJECTSTORE", "local") != "s3":
        problems.append("CONTROLPLANE_OBJECTSTORE must be s3 (with local, release wheels are kept in "
                        "LOCAL_OBJECTSTORE_ROOT on one machine's disk, where no other machine can install them)")
    elif not environ.get("S3_BUCKET"):
        problems.append("S3_BUCKET must be set: CONTROLPLANE_OBJECTSTORE=s3 keeps the control plane's objects there")
    if not environ.get("EMAIL_URL"):
        problems.append("EMAIL_URL must be set (without it the portal's mail is written as files under var/mail on "
                        "one machine's disk and never sent)")
    if not environ.get("ALLOWED_HOSTS"):
        problems.append("ALLOWED_HOSTS must be set (the default serves localhost names)")
    if environ.get("TENANT_DATABASE_ALLOW_INSECURE_AUTH", "").strip().lower() in ("true", "on", "ok", "y", "yes", "1"):
        problems.append("TENANT_DATABASE_ALLOW_INSECURE_AUTH must be off (it provisions onto a server that trusts"
                        " tenant roles without their password)")
    if environ.get("EGRESS_ALLOW_PRIVATE_ADDRESSES", "").strip().lower() in ("true", "on", "ok", "y", "yes", "1"):
        problems.append("EGRESS_ALLOW_PRIVATE_ADDRESSES must be off (it lets every tenant's egress proxy reach the"
                        " machine's loopback, private networks and cloud metadata)")
    if environ.get("LOCAL_INSTANCE_LOOPBACK_GRANTS", "").strip(" ,"):
        problems.append("LOCAL_INSTANCE_LOOPBACK_GRANTS must be empty (it lets every instance reach the named "
                        "loopback services of the machine; production instances reach only their own and the "
                        "egress proxy)")
    problems += fault_injection_problems(environ, production=True)
    return problems


def policy_with_form_action(policy: str, origins: Iterable[str]) -> str:
    """``policy`` with ``origins`` added to its ``form-action`` directive: a page whose form is answered by a
    redirect to another origin (the portal's Connect button, sent on to the provider's authorization endpoint)
    needs that origin there, or the browser stops the redirect. A policy without ``form-action`` restricts no
    form target and is returned as it is."""
    extra = [o for o in dict.fromkeys(origins) if o and all(c not in o for c in " ;,'\"\n")]
    directives = [d.strip() for d in policy.split(";") if d.strip()]
    for i, directive in enumerate(directives):
        if directive.split()[0].lower() == "form-action" and extra:
            directives[i] = " ".join([directive, *extra])
    return "; ".join(directives) + (";" if policy.rstrip().endswith(";") else "")


class ContentSecurityPolicyMiddleware:
    """Adds ``settings.CONTENT_SECURITY_POLICY`` to every response that did not choose its own.

    Also ``X-Frame-Options: DENY`` on responses that never reach Django's clickjacking middleware
    (static files answered by WhiteNoise further up the stack).
    """

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from django.conf import settings

        self.get_response = get_response
        self.policy = settings.CONTENT_SECURITY_POLICY

    def __call__(self, request: Any) -> Any:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        if "X-Frame-Options" not in response and not getattr(response, "xframe_options_exempt", False):
            response["X-Frame-Options"] = "DENY"
        return response


class RejectNulBytesMiddleware:
    """400 for a NUL byte anywhere in the path, query string or headers.

    PostgreSQL text cannot hold NUL, so such a value reaching a query is a database error (a 500)
    wherever a path parameter, filter or header is used in a lookup. Forms and serializers already
    refuse NUL in bodies (``ProhibitNullCharactersValidator``); this covers everything else, once.
    """

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        from urllib.parse import unquote_to_bytes

        query = request.META.get("QUERY_STRING", "")
        if ("\x00" in request.path or b"\x00" in unquote_to_bytes(query.replace("+", " "))
                or any("\x00" in str(v) for k, v in request.META.items() if k.startswith("HTTP_"))):
            return _bad_request(request, "the request contains a NUL byte")
        return self.get_response(request)


def _bad_request(request: Any, detail: str) -> Any:
    from django.http import HttpResponse, JsonResponse

    if request.path.startswith(("/api/", "/internal/")):
        from .problems import PROBLEM_CONTENT_TYPE, TYPE_BASE

        return JsonResponse({"type": TYPE_BASE + "invalid-input", "title": "Invalid input", "status": 400,
                             "detail": detail}, status=400, content_type=PROBLEM_CONTENT_TYPE)
    return HttpResponse(detail.encode(), status=400, content_type="text/plain; charset=utf-8")
