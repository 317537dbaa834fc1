"""Every problem ``type`` the API answers with, and the page each one resolves to (``/problems/<slug>``).

RFC 7807 asks that a problem type URI, when dereferenced, explain the problem to a human. Ours are
relative references (``/problems/not-found``), resolved against the API's own host, so they always
lead to a page this product serves: what the problem means and what the caller can do about it.
``tests/controlplane/test_problem_types.py`` fails if code answers with a type that has no entry here.
"""

from __future__ import annotations

from typing import NamedTuple

from django.views.decorators.http import require_safe

__all__ = ["ProblemType", "PROBLEM_TYPES", "TYPE_PATH", "has_page"]

TYPE_PATH = "/problems/"


class ProblemType(NamedTuple):
    title: str
    status: str
    meaning: str
    action: str


PROBLEM_TYPES: dict[str, ProblemType] = {
    # --- requests the API refuses
    "bad-request": ProblemType("Bad request", "400", "The request cannot be used as sent.",
                               "Read `detail`, correct the request and send it again."),
    "invalid-input": ProblemType("Invalid input", "400", "A field or parameter is missing, unknown or invalid; "
                                 "`errors` lists each one with its field.", "Fix the named fields and retry."),
    "unauthenticated": ProblemType("Authentication required", "401", "No token, an unknown, expired or revoked "
                                   "one, or a token of another kind (an instance token on the operator API).",
                                   "Send `Authorization: Bearer <token>` with a valid token for this API."),
    "forbidden": ProblemType("Forbidden", "403", "The token is valid but lacks the scope this operation needs.",
                             "Use a token with the scope named in `detail`."),
    "not-found": ProblemType("Not found", "404", "No such endpoint, or no such object among yours (another "
                             "operator's tenant is not found either, on purpose).", "Check the id or the path."),
    "method-not-allowed": ProblemType("Method not allowed", "405", "The endpoint exists; this method does not.",
                                      "Use a method listed in the `Allow` header."),
    "not-acceptable": ProblemType("Not acceptable", "406", "The `Accept` header asks for a format the endpoint "
                                  "does not produce.", "Accept `application/json` (or the stream's type)."),
    "payload-too-large": ProblemType("Payload too large", "413", "The body is larger than the limit, "
                                     "`max_bytes`.", "Send less; large files go through their own upload."),
    "unsupported-media-type": ProblemType("Unsupported media type", "415", "The body's `Content-Type` is not "
                                          "one this endpoint reads.", "Send `application/json`."),
    "throttled": ProblemType("Too many requests", "429", "The operator's request rate is over its allowance "
                             "for this window.", "Wait `Retry-After` seconds."),
    "quota-exceeded": ProblemType("Quota exceeded", "429", "The operator has as many tenants as its quota "
                                  "allows, or the tenant's plan allows no more messages or tasks today.",
                                  "Deprovision a tenant or raise the quota; for a plan's daily quota, wait until "
                                  "tomorrow (UTC) or move the tenant to a larger plan (`PATCH` its `plan`)."),
    "monthly-limit-reached": ProblemType("Monthly limit reached", "429", "The tenant's plan allows so many tasks "
                                         "(`max_tasks_per_month`, messages included) or model tokens "
                                         "(`max_tokens_per_month`) a UTC month and this month's usage has reached "
                                         "it: `limit`, `used` and `resets_at` say which, how much and until when. "
                                         "Tasks already running are not stopped.", "Wait until `resets_at` "
                                         "(`Retry-After` seconds) or move the tenant to a larger plan."),
    "conflict": ProblemType("Conflict", "409", "The request contradicts the object's current state (a settled "
                            "effect decided again, a cancelled task, the same id with other content).",
                            "Read the object again; do not retry blindly."),
    "invalid-transition": ProblemType("Invalid state transition", "409", "The tenant cannot go from its "
                                      "current status to the one asked for.", "Wait for the current workflow "
                                      "to finish, then retry."),
    "no-default-release": ProblemType("No default release", "409", "Onboarding a customer while the operator "
                                      "has no default release: its instance would run no release of yours, only "
                                      "what the runtime has installed.", "Upload a release and make it the "
                                      "default (`PUT /api/v1/releases/default`), then retry; or send "
                                      "`allow_no_release: true` to onboard it on no release on purpose."),
    "release-artifact-unsupported": ProblemType("Release artifact not supported here", "409", "The release is "
                                                "of the kind this control plane cannot run: its instances run on "
                                                "Kubernetes (a container image pinned by digest) or as local "
                                                "processes (a wheel).", "Register the release as the kind `detail` "
                                                "names (docs/releases.md)."),
    "idempotency-key-reused": ProblemType("Idempotency key reused", "422", "The `Idempotency-Key` was used "
                                          "before with another request body.", "Use a new key for a new "
                                          "request; resend the same body to get the first answer."),
    # --- the control plane or what it depends on
    "error": ProblemType("Error", "4xx", "A client error without a more specific type.", "Read `detail`."),
    "internal-error": ProblemType("Internal server error", "500", "The control plane failed; the error is "
                                  "logged with the request.", "Retry later; report it with the time and path."),
    "not-ready": ProblemType("Not ready", "503", "`/readyz`: the database, the broker or the cache does not "
                             "answer.", "Operators: see `checks` and the log (`controlplane.health`)."),
    "provisioning-failed": ProblemType("Provisioning failed", "502", "A driver could not create or repair a "
                                       "tenant resource.", "The tenant's `status_reason` names the step; retry "
                                       "it once the cause is fixed."),
    "unrecoverable": ProblemType("Unrecoverable", "502", "A recovery step found state it must not repair on "
                                 "its own.", "A person decides: see the recovery event."),
    "vault-error": ProblemType("Vault error", "500", "The credential vault failed.", "Retry; staff see the log."),
    "decryption-failed": ProblemType("Decryption failed", "500", "A sealed value does not open with its key.",
                                     "Staff: check the key ring and the value's key version."),
    "vault-key-ring-mismatch": ProblemType("Vault key ring mismatch", "503", "The key ring does not hold the "
                                           "key this data was sealed with.", "Staff: deploy the right key ring."),
    # --- OAuth providers, for connected accounts (docs/connections.md)
    "oauth-provider-refused": ProblemType("OAuth provider refused", "502", "The provider's token endpoint "
                                          "answered an OAuth error; `oauth_error` is its code (e.g. "
                                          "`invalid_grant`, `invalid_client`).", "Check the OAuth client's id, "
                                          "secret and endpoints; for `invalid_grant` the customer connects again."),
    "oauth-provider-unreachable": ProblemType("OAuth provider unreachable", "502", "The provider did not answer "
                                              "usably (refused, timed out, not JSON).", "Retry later; check the "
                                              "OAuth client's endpoints."),
    "connection-needs-reauth": ProblemType("Connection needs the customer", "409", "The customer's connection to "
                                           "`provider` is `connection_status` (`reason`: e.g. `invalid_grant`, "
                                           "`disconnected`): no token can be had from it.", "The customer connects "
                                           "the account again; blocked tasks then resume by themselves."),
    "connection-not-declared": ProblemType("Connection not declared by the agent", "403", "The agents of the "
                                           "release the tenant runs do not declare `provider` in "
                                           "`Agent(connections=[...])`: its instance is never handed that "
                                           "connection.", "Declare the provider in the agent and ship a new "
                                           "release."),
    # --- the tenant's instance, reached through the control plane (its own codes, with _ as -)
    "instance-unavailable": ProblemType("Agent instance unavailable", "503", "The tenant's instance is not "
                                        "running or did not answer in time; writes were queued in the inbox.",
                                        "Retry reads later; queued writes are delivered when it is back."),
    "instance-error": ProblemType("Agent instance error", "502", "The instance answered with an error of its "
                                  "own.", "Read `detail`."),
    "invalid": ProblemType("Invalid request to the instance", "400", "The instance refused a parameter.",
                           "Fix the named parameter."),
    "invalid-json": ProblemType("Invalid JSON", "400", "The body is not JSON.", "Send a JSON object."),
    "unknown-kind": ProblemType("Unknown task kind", "409", "The instance has no agent of that kind (its "
                                "current release does not declare it).", "Use a kind the tenant's agent release "
                                "declares, or roll out a release that brings it."),
    "tenant-suspended": ProblemType("Tenant suspended", "409", "The tenant is suspended: its instance is stopped "
                                    "on purpose and reads of its state wait until it is resumed. Messages and "
                                    "tasks sent meanwhile wait in the inbox.", "Resume the tenant "
                                    "(`POST /tenants/{id}/resume`), then read again."),
    "instance-not-ready": ProblemType("Instance not provisioned yet", "409", "The tenant is still being "
                                      "onboarded (or its onboarding failed), so there is no instance to read "
                                      "from. Messages and tasks sent meanwhile wait in the inbox.", "Poll the "
                                      "tenant until its status is `ready`; if `failed`, see `status_reason`."),
    "conversations-unsupported": ProblemType("Not a conversational agent", "409", "The tenant's agent does not "
                                             "take messages.", "Submit tasks instead, or deploy a conversational "
                                             "agent."),
    "thread-busy": ProblemType("Thread busy", "409", "The thread's policy is `reject` and its previous run is "
                               "still going; `task` names it. Nothing was stored.", "Wait for that task to end "
                               "(its reply stream), or send with another `policy` (docs/conversations.md)."),
    "rollback-refused": ProblemType("Rollback refused", "409", "A `rollback` would discard a run that has an effect "
                                    "that happened or may have (a payment, an email); `effect` names it. Effects "
                                    "are never undone, so nothing was changed and nothing was stored.",
                                    "Send the message with `interrupt` (the run stops, its effect stays) or "
                                    "`enqueue`."),
    "too-large": ProblemType("Too large", "413", "The instance's body limit was exceeded.", "Send less."),
    "unauthorized": ProblemType("Refused by the instance", "401", "The instance did not accept the control "
                                "plane's signature.", "Staff: the instance's token may have been rotated."),
    # --- the operator portal's own pages (HTML, not the API)
    "invitation-not-valid": ProblemType("Invitation not valid", "410", "The team invitation link is forged, "
                                        "expired, withdrawn or already used.", "Ask an admin of the team for a "
                                        "new invitation."),
    "mail-failed": ProblemType("Mail could not be sent", "503", "The mail server refused or could not be reached; "
                               "nothing was sent and an invitation made for it was withdrawn.",
                               "Check EMAIL_URL (docs/operations.md) and try again."),
}


def _with_code(text: str) -> str:
    """The texts quote names in backticks, as the docs do: shown as code, everything else escaped."""
    from django.utils.html import escape
    from django.utils.safestring import mark_safe

    parts = text.split("`")
    return mark_safe("".join(  # noqa: S308 - every part is escaped
        escape(part) if i % 2 == 0 else f"<code>{escape(part)}</code>" for i, part in enumerate(parts)))


def has_page(type_uri: str) -> bool:
    """Whether a problem's ``type`` resolves to one of the pages below."""
    return type_uri.startswith(TYPE_PATH) and type_uri[len(TYPE_PATH):] in PROBLEM_TYPES


@require_safe
def problem_page(request, slug: str = ""):
    """``/problems/`` and ``/problems/<slug>``: the page a problem's ``type`` resolves to (HTML, no login)."""
    from django.http import Http404
    from django.shortcuts import render

    if slug and slug not in PROBLEM_TYPES:
        raise Http404("no such problem type")
    problem = PROBLEM_TYPES.get(slug)
    return render(request, "problems/page.html", {
        "slug": slug, "problem": problem,
        "meaning": _with_code(problem.meaning) if problem else "",
        "action": _with_code(problem.action) if problem else "",
        "problems": [(s, p, _with_code(p.meaning)) for s, p in sorted(PROBLEM_TYPES.items())],
    })
