"""First access to an operator's portal from the command line (``manage.py ensure_portal_user``).

For the demo and a fresh install, where nobody can be invited yet: the portal host name on the operator
and a first admin with a generated password, each created at most once (re-running changes nothing).
Everyone after that arrives through invitations (``services.invitation_issue``). No views here.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.http.request import validate_host

from controlplane.errors import ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator

from .choices import MembershipRole
from .models import OperatorMembership

__all__ = ["PortalAdmin", "portal_domain_ensure", "portal_admin_ensure"]

_HOST_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


@dataclass(frozen=True)
class PortalAdmin:
    user: Any
    password: str | None  # generated now, shown once; None when the user existed already
    member_added: bool


def portal_domain_ensure(*, operator: Operator, domain: str, actor: Actor) -> bool:
    """Add ``domain`` to the operator's portal host names; False if it was there already.

    Refused when the name could never serve this portal: a control-plane host (it serves the dashboard),
    a name ``ALLOWED_HOSTS`` rejects (Django answers 400 before the portal sees it), or one another
    operator holds (the middleware would pick one of the two).
    """
    host = domain.strip().lower().rstrip(".")
    if not _HOST_NAME.match(host):
        raise ValidationFailed(f"{domain!r} is not a host name")
    if validate_host(host, settings.CONTROL_PLANE_HOSTS):
        raise ValidationFailed(f"{host} is a control-plane host (CONTROL_PLANE_HOSTS): it never serves a portal")
    if not validate_host(host, settings.ALLOWED_HOSTS):
        raise ValidationFailed(f"{host} is not allowed by ALLOWED_HOSTS; add it (or its domain) to "
                               "PORTAL_ALLOWED_HOSTS")
    with transaction.atomic():
        locked = Operator.objects.select_for_update().get(pk=operator.pk)
        if host in locked.domains:
            return False
        if Operator.objects.filter(domains__contains=[host]).exclude(pk=locked.pk).exists():
            raise ValidationFailed(f"{host} is already another operator's portal host")
        locked.domains = [*locked.domains, host]
        locked.save(update_fields=["domains"])
        audit_record(actor=actor, action=AuditAction.OPERATOR_DOMAIN_ADD, target=locked, operator=locked,
                     data={"domain": host})
    operator.domains = locked.domains
    return True


def portal_admin_ensure(*, operator: Operator, username: str, actor: Actor) -> PortalAdmin:
    """A portal admin ``username`` of ``operator``: created with a generated password if missing."""
    users = get_user_model()
    with transaction.atomic():
        user = users.objects.filter(username=username).first()
        password = None
        if user is None:
            password = secrets.token_urlsafe(12)
            user = users.objects.create_user(username=username, password=password)
        membership, added = OperatorMembership.objects.get_or_create(
            user=user, operator=operator, defaults={"role": MembershipRole.ADMIN})
        if added:
            audit_record(actor=actor, action=AuditAction.PORTAL_MEMBERSHIP_CREATE, target=membership, operator=operator,
                         data={"username": username, "role": membership.role})
    return PortalAdmin(user=user, password=password, member_added=added)
