"""Build the instance's effect providers from its configuration (no I/O: adapters connect when used).

`AGENT_EFFECTS` is a JSON object, effect name -> {"type": "http" | "smtp" | "webhook", ...options}:
- http: url, method, lookup_url (template with {key}), lookup_consistency_s (how long after an attempt the
  lookup may still miss it), lookup_absent_status, replay_safe, key_header, key_body_field, headers,
  bearer_credential, timeout_s
- smtp: url (smtp://[user:credential-name@]host:port[?starttls=1] or smtps://), domain, timeout_s,
  imap_lookup ({"url": "imap[s]://user:credential-name@host:port/MAILBOX", "consistency_window_s": N,
  "timeout_s": N}: an email in doubt is looked up by Message-ID in that folder, "Sent" by default; "absent" is
  trusted only N seconds after the attempt, 60 by default)
- webhook: url, secret_credential, timeout_s
Two shortcuts stay for the demo's providers: `AGENT_SMTP_URL` (effect "email", with `AGENT_SMTP_IMAP_LOOKUP_URL`
and `AGENT_SMTP_IMAP_LOOKUP_WINDOW_S` as its imap_lookup) and `AGENT_PAYMENTS_URL`
(effect "payment": a Stripe-style charges API at that base URL, looked up through its search API by the key
kept in metadata; the search lags, so "absent" is trusted only `AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S` after
an attempt: 60 s by default, Stripe's documented indexing delay).

Per customer (issue 32), the reserved top-level key `effects` of a task's agent configuration has the same shape as
`AGENT_EFFECTS` (`adapters_from_config`); its providers replace the instance's of the same name for that task.
Credentials in it are names (`bearer_credential`, `secret_credential`, `user:credential-name@`), never values.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlparse

from agent_runtime.effects.http import HttpIdempotentEffect
from agent_runtime.effects.imap import ImapLookup
from agent_runtime.effects.smtp import SmtpEffect
from agent_runtime.effects.webhook import WebhookEffect
from agent_runtime.errors import ConfigError

__all__ = ["CONFIG_EFFECTS_KEY", "EffectsSpecInvalid", "adapter_from_spec", "adapters_from_config",
           "adapters_from_env", "effects_credentials", "effects_validate", "payments_api_spec"]

# The reserved top-level key of an agent configuration that names its effect providers.
CONFIG_EFFECTS_KEY = "effects"

_TYPES: dict[str, type] = {"http": HttpIdempotentEffect, "smtp": SmtpEffect, "webhook": WebhookEffect}


# Stripe: "under normal operating conditions, data is searchable in less than a minute".
SEARCH_CONSISTENCY_S = 60.0


def payments_api_spec(base_url: str, lookup_consistency_s: float = SEARCH_CONSISTENCY_S) -> dict[str, Any]:
    """A Stripe-style charges API: POST /v1/charges with Idempotency-Key; the key is also stored in the
    charge's metadata so `GET /v1/charges/search` can say whether a charge exists for it, once the search has
    indexed it (`lookup_consistency_s`). The provider is not assumed to honour the key (not `replay_safe`)."""
    base = base_url.rstrip("/")
    return {"type": "http", "url": f"{base}/v1/charges", "key_body_field": "metadata.idempotency_key",
            "lookup_url": f"{base}/v1/charges/search?query=metadata%5B%27idempotency_key%27%5D%3A%27{{key}}%27",
            "lookup_consistency_s": lookup_consistency_s}


# A Sent folder or archive is filed by the relay or the mail client, perhaps after the send: unless told how
# late, "absent" is trusted a minute after the attempt.
IMAP_CONSISTENCY_S = 60.0
_IMAP_LOOKUP_OPTIONS = ("url", "consistency_window_s", "timeout_s")


def _smtp_imap_lookup(name: str, options: dict[str, Any], credentials: Any) -> None:
    """Replace an smtp effect's `imap_lookup` option with SmtpEffect's `lookup` and `lookup_consistency_s`."""
    if "lookup" in options:
        raise ConfigError(f"effect {name!r}: an smtp effect is looked up through 'imap_lookup', not 'lookup'")
    spec = options.pop("imap_lookup", None)
    if spec is None:
        return
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str) or not spec["url"]:
        raise ConfigError(f"effect {name!r}: 'imap_lookup' must be an object with a 'url' "
                          "(imap[s]://user:credential-name@host:port/MAILBOX)")
    unknown = sorted(set(spec) - set(_IMAP_LOOKUP_OPTIONS))
    if unknown:
        raise ConfigError(f"effect {name!r}: unknown 'imap_lookup' options {unknown} "
                          f"(known: {', '.join(_IMAP_LOOKUP_OPTIONS)})")
    if "lookup_consistency_s" in options:
        raise ConfigError(f"effect {name!r}: give the window as imap_lookup's 'consistency_window_s' only")
    for option, default in (("consistency_window_s", IMAP_CONSISTENCY_S), ("timeout_s", 10.0)):
        value = spec.get(option, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"effect {name!r}: imap_lookup's {option!r} must be 0 or more seconds, not {value!r}")
    try:
        options["lookup"] = ImapLookup(spec["url"], credentials=credentials,
                                       timeout_s=float(spec.get("timeout_s", 10.0)))
    except ValueError as exc:
        raise ConfigError(f"effect {name!r}: imap_lookup: {exc}") from exc
    options["lookup_consistency_s"] = float(spec.get("consistency_window_s", IMAP_CONSISTENCY_S))


def adapter_from_spec(name: str, spec: Mapping[str, Any], credentials: Any) -> Any:
    options = dict(spec)
    kind = options.pop("type", None)
    cls = _TYPES.get(str(kind))
    if cls is None:
        raise ConfigError(f"effect {name!r}: unknown type {kind!r} (one of {sorted(_TYPES)})")
    url = options.pop("url", None)
    if not url:
        raise ConfigError(f"effect {name!r}: 'url' is required")
    if cls is not HttpIdempotentEffect or options.get("bearer_credential"):
        options["credentials"] = credentials
    if cls is SmtpEffect:
        _smtp_imap_lookup(name, options, credentials)
    try:
        return cls(url, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"effect {name!r}: {exc}") from exc


def adapters_from_env(env: Mapping[str, str], credentials: Any) -> dict[str, Any]:
    specs: dict[str, Any] = {}
    if env.get("AGENT_SMTP_URL"):
        specs["email"] = {"type": "smtp", "url": env["AGENT_SMTP_URL"]}
    imap_url, imap_window = env.get("AGENT_SMTP_IMAP_LOOKUP_URL", ""), env.get("AGENT_SMTP_IMAP_LOOKUP_WINDOW_S", "")
    if (imap_url or imap_window) and not (env.get("AGENT_SMTP_URL") and imap_url):
        raise ConfigError("AGENT_SMTP_IMAP_LOOKUP_URL and AGENT_SMTP_IMAP_LOOKUP_WINDOW_S configure the lookup of "
                          "AGENT_SMTP_URL's effect: they need AGENT_SMTP_URL, and the window needs the URL")
    if imap_url:
        try:
            imap_window_s = float(imap_window) if imap_window else IMAP_CONSISTENCY_S
        except ValueError as exc:
            raise ConfigError(f"AGENT_SMTP_IMAP_LOOKUP_WINDOW_S must be a number of seconds, not {imap_window!r}"
                              ) from exc
        specs["email"]["imap_lookup"] = {"url": imap_url, "consistency_window_s": imap_window_s}
    if env.get("AGENT_PAYMENTS_URL"):
        window = env.get("AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S", "")
        try:
            consistency = float(window) if window else SEARCH_CONSISTENCY_S
        except ValueError as exc:
            raise ConfigError(f"AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S must be a number of seconds, not {window!r}"
                              ) from exc
        if consistency < 0:
            raise ConfigError("AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S must be 0 or more seconds")
        specs["payment"] = payments_api_spec(env["AGENT_PAYMENTS_URL"], consistency)
    if env.get("AGENT_EFFECTS"):
        try:
            configured = json.loads(env["AGENT_EFFECTS"])
        except ValueError as exc:
            raise ConfigError(f"AGENT_EFFECTS is not valid JSON: {exc}") from exc
        if not isinstance(configured, dict) or not all(isinstance(v, dict) for v in configured.values()):
            raise ConfigError("AGENT_EFFECTS must be a JSON object of effect name -> object")
        specs.update(configured)
    return {name: adapter_from_spec(name, spec, credentials) for name, spec in specs.items()}


def adapters_from_config(config: Mapping[str, Any], credentials: Any) -> dict[str, Any]:
    """The providers a task's agent configuration names under `effects` ({} without the key); ConfigError naming
    the effect when a spec is not one. No I/O: built per task, they connect when used."""
    configured = config.get(CONFIG_EFFECTS_KEY)
    if configured is None:
        return {}
    if not isinstance(configured, dict) or not all(isinstance(v, dict) for v in configured.values()):
        raise ConfigError(f"the configuration's {CONFIG_EFFECTS_KEY!r} must be an object of effect name -> object")
    return {name: adapter_from_spec(name, spec, credentials) for name, spec in configured.items()}


class EffectsSpecInvalid(ConfigError):
    """An `effects` configuration that `adapters_from_config` would refuse; `field` is the path of the offending
    value under `effects` ("" for the whole object, "payment", "payment.url")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _NoCredentials:
    """Validation builds adapters without a vault: they only read a credential when used, and are never used."""

    def get(self, name: str) -> Any:
        raise AssertionError(f"a credential ({name!r}) was read while validating a configuration")


def _options_of(cls: type) -> set[str]:
    params = set(inspect.signature(cls).parameters) - {"url", "credentials"}
    return params - {"lookup"} | {"imap_lookup"} if cls is SmtpEffect else params


def effects_credentials(effects: Mapping[str, Any]) -> dict[str, str]:
    """The vault credentials a valid `effects` configuration names, by field (``payment.bearer_credential``,
    ``email.url`` for smtp's ``user:credential-name@``, ``email.imap_lookup.url``): what the control plane checks
    its tenant's vault holds before accepting the configuration. Names only; never a value."""
    named: dict[str, str] = {}
    for name, spec in effects.items():
        for option in ("bearer_credential", "secret_credential"):
            if isinstance(spec.get(option), str) and spec[option]:
                named[f"{name}.{option}"] = spec[option]
        if spec.get("type") == "smtp":
            for field, url in ((f"{name}.url", spec.get("url")),
                               (f"{name}.imap_lookup.url", (spec.get("imap_lookup") or {}).get("url"))):
                password = urlparse(url).password if isinstance(url, str) else None
                if password:
                    named[field] = unquote(password)
    return named


def effects_validate(effects: object) -> None:
    """EffectsSpecInvalid (naming the field) unless `effects` is what `adapters_from_config` builds providers from.

    No I/O: the adapters are built, never used, with no credentials. Stricter than AGENT_EFFECTS, because a
    customer's configuration is written through an API: options must be known and http/webhook URLs http(s)."""
    if not isinstance(effects, dict):
        raise EffectsSpecInvalid("", "must be an object of effect name -> {\"type\": \"http\" | \"smtp\" | "
                                     "\"webhook\", ...}")
    for name, spec in effects.items():
        if not isinstance(spec, dict):
            raise EffectsSpecInvalid(name, "must be an object with a 'type' and a 'url'")
        cls = _TYPES.get(str(spec.get("type")))
        if cls is None:
            raise EffectsSpecInvalid(f"{name}.type", f"must be one of {sorted(_TYPES)}, not {spec.get('type')!r}")
        url = spec.get("url")
        if not isinstance(url, str) or not url:
            raise EffectsSpecInvalid(f"{name}.url", "is required (a string)")
        if cls is not SmtpEffect and urlparse(url).scheme not in ("http", "https"):
            raise EffectsSpecInvalid(f"{name}.url", "must be an http:// or https:// URL")
        unknown = sorted(set(spec) - {"type", "url"} - _options_of(cls))
        if unknown:
            raise EffectsSpecInvalid(f"{name}.{unknown[0]}", f"is not an option of a {spec['type']} effect "
                                     f"(known: {', '.join(sorted(_options_of(cls)))})")
        try:
            adapter_from_spec(name, spec, _NoCredentials())
        except ConfigError as exc:
            # The adapters' messages name the option they refuse: point at it when one is named.
            named = [option for option in sorted(_options_of(cls) | {"url"}, key=len, reverse=True)
                     if option in str(exc).lower()]
            raise EffectsSpecInvalid(f"{name}.{named[0]}" if named else name, str(exc)) from None
