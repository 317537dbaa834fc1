"""Portal writes: team invitations (issue, accept, revoke) and membership removal.

An invitation's token is 256 random bits shown only in the mail; the row keeps its SHA-256, so neither a
database reader nor a log line can accept it. Mail goes through Django's configured ``EMAIL_BACKEND``
after the row is committed; if the backend refuses, the invitation is revoked again (an invitation
nobody received must not linger as "pending"), and the caller is told.

Rendering links and pages is the views' job: ``invitation_issue`` takes the accept link's builder.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from controlplane.errors import ApplicationError, Conflict, NotFound, ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator

from .choices import MembershipRole
from .models import OperatorInvitation, OperatorMembership

__all__ = ["InvitationRefused", "MailFailed", "IssuedInvitation", "invitation_token_hash", "invitation_issue",
           "invitation_check", "existing_user_for", "invitation_accept", "invitation_revoke", "membership_remove",
           "password_reset_mail_allowed"]

logger = logging.getLogger(__name__)


class InvitationRefused(ApplicationError):
    """The link is forged, expired, revoked or already used. ``reason`` picks the page's wording."""

    status_code = 410
    title = "Invitation not valid"
    type_slug = "invitation-not-valid"

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail, extra={"reason": reason})
        self.reason = reason


class MailFailed(ApplicationError):
    status_code = 503
    title = "Mail could not be sent"
    type_slug = "mail-failed"


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: OperatorInvitation
    link: str  # contains the token: sent by mail, never shown, logged or stored


def invitation_token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _clean_email(email: object) -> str:
    text = str(email or "").strip()
    try:
        validate_email(text)
    except ValidationError:
        raise ValidationFailed(f"{text[:100]!r} is not an email address.") from None
    local, _, domain = text.rpartition("@")
    return f"{local}@{domain.lower()}"


def invitation_issue(*, operator: Operator, email: str, role: str, actor: Actor, invited_by: Any,
                     link_for: Callable[[str], str], product_name: str) -> IssuedInvitation:
    """Invite ``email`` to ``operator``'s team as ``role`` and mail the link.

    A newer invitation to the same address replaces the pending one (its link stops working), so
    "send again" is just inviting again. Someone already in the team is refused.
    """
    email = _clean_email(email)
    if role not in MembershipRole.values:
        raise ValidationFailed(f"role must be one of: {', '.join(MembershipRole.values)}")
    if OperatorMembership.objects.filter(operator=operator, user__email__iexact=email).exists():
        raise Conflict(f"{email} is already in the team.")
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        replaced = OperatorInvitation.objects.filter(operator=operator, email__iexact=email, accepted_at__isnull=True,
                                                     revoked_at__isnull=True).update(revoked_at=now)
        invitation = OperatorInvitation.objects.create(
            operator=operator, email=email, role=role, token_hash=invitation_token_hash(token),
            invited_by=invited_by, expires_at=now + timedelta(seconds=settings.PORTAL_INVITATION_TTL_S),
        )
        audit_record(actor=actor, action=AuditAction.PORTAL_INVITATION_ISSUE, target=invitation, operator=operator,
                     data={"email": email, "role": role, "replaced": replaced})
    link = link_for(token)
    context = {"product_name": product_name, "operator": operator, "role": invitation.get_role_display(),
               "link": link, "expires_at": invitation.expires_at, "inviter": actor.label}
    try:
        send_mail(subject=f"You are invited to {product_name}",
                  message=render_to_string("portal/email/invitation.txt", context),
                  from_email=None, recipient_list=[email])
    except Exception as exc:  # any backend failure (SMTP refusal, DNS, timeout, disk)
        OperatorInvitation.objects.filter(pk=invitation.pk).update(revoked_at=timezone.now())
        # The exception type only: an SMTP error can echo the message, and the message carries the token.
        logger.warning("invitation mail to %s failed: %s", email, type(exc).__name__)
        raise MailFailed(f"The invitation to {email} could not be mailed ({type(exc).__name__}); "
                         "nothing was sent. Check the mail settings (EMAIL_URL) and invite again.") from None
    return IssuedInvitation(invitation=invitation, link=link)


def invitation_check(*, operator: Operator, token: str) -> OperatorInvitation:
    """The pending invitation this token opens on this operator's host, or ``InvitationRefused``.

    Another operator's invitation is refused like a forged one: the host decides which team one joins.
    """
    digest = invitation_token_hash(str(token))
    invitation = OperatorInvitation.objects.filter(token_hash=digest, operator=operator).first()
    if invitation is None or not hmac.compare_digest(invitation.token_hash, digest):
        raise InvitationRefused("This invitation link is not valid. Check that you copied all of it, or ask "
                                "for a new invitation.", reason="invalid")
    if invitation.accepted_at is not None:
        raise InvitationRefused("This invitation has already been used. Sign in instead, or ask for a new "
                                "invitation.", reason="used")
    if invitation.revoked_at is not None:
        raise InvitationRefused("This invitation was withdrawn or replaced by a newer one. Use the newest "
                                "invitation mail, or ask for a new one.", reason="revoked")
    if invitation.expires_at <= timezone.now():
        raise InvitationRefused("This invitation has expired. Ask the person who invited you to send a new one.",
                                reason="expired")
    return invitation


def existing_user_for(invitation: OperatorInvitation) -> Any:
    """The active account already registered under the invited address, if any (it is attached, not copied)."""
    return get_user_model().objects.filter(email__iexact=invitation.email, is_active=True).order_by("pk").first()


def invitation_accept(*, operator: Operator, token: str, username: str = "", password: str = "",
                      existing_user: Any = None) -> OperatorMembership:
    """Accept: create the account (``username`` + ``password``), or attach ``existing_user`` (already
    authenticated by the view with its own password), and create the membership. Single use: the
    invitation row is locked, so two concurrent accepts produce one membership and one refusal."""
    User = get_user_model()
    with transaction.atomic():
        checked = invitation_check(operator=operator, token=token)
        OperatorInvitation.objects.select_for_update().filter(pk=checked.pk).first()  # the lock
        invitation = invitation_check(operator=operator, token=token)  # read again, under the lock
        if existing_user is not None:
            if (existing_user.email or "").lower() != invitation.email.lower():
                raise ValidationFailed("That account is not registered under the invited address.")
            user = existing_user
        else:
            username = str(username or "").strip()
            if not username:
                raise ValidationFailed("Choose a username.")
            if User.objects.filter(username__iexact=username).exists():
                raise ValidationFailed(f"The username {username!r} is taken; choose another.")
            candidate = User(username=username, email=invitation.email)
            try:
                validate_password(password, user=candidate)
            except ValidationError as exc:
                raise ValidationFailed(" ".join(exc.messages)) from None
            try:
                with transaction.atomic():
                    user = User.objects.create_user(username=username, email=invitation.email, password=password)
            except IntegrityError:
                raise ValidationFailed(f"The username {username!r} is taken; choose another.") from None
        membership, created = OperatorMembership.objects.get_or_create(
            user=user, operator=operator, defaults={"role": invitation.role})
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        audit_record(actor=Actor.for_user(user), action=AuditAction.PORTAL_INVITATION_ACCEPT, target=invitation,
                     operator=operator, data={"email": invitation.email, "role": membership.role,
                                              "new_account": existing_user is None, "already_member": not created})
    return membership


def invitation_revoke(*, operator: Operator, invitation_id: object, actor: Actor) -> OperatorInvitation:
    with transaction.atomic():
        invitation = (OperatorInvitation.objects.select_for_update()
                      .filter(operator=operator, pk=invitation_id).first())
        if invitation is None:
            raise NotFound("invitation not found")
        if invitation.accepted_at is None and invitation.revoked_at is None:
            invitation.revoked_at = timezone.now()
            invitation.save(update_fields=["revoked_at"])
            audit_record(actor=actor, action=AuditAction.PORTAL_INVITATION_REVOKE, target=invitation, operator=operator,
                         data={"email": invitation.email})
    return invitation


def password_reset_mail_allowed(*, operator: Operator, email: str) -> bool:
    """One reset mail per address and operator per ``PORTAL_PASSWORD_RESET_INTERVAL_S``, so the form cannot
    be used to flood a member's inbox. Counted in the shared cache (Redis in production)."""
    digest = hashlib.sha256(email.strip().lower().encode()).hexdigest()
    return bool(cache.add(f"portal:reset-mail:{operator.pk}:{digest}", 1,
                          timeout=settings.PORTAL_PASSWORD_RESET_INTERVAL_S))


def membership_remove(*, operator: Operator, membership_id: object, actor: Actor) -> OperatorMembership:
    """Remove someone from the team. The last admin stays, so the team can always manage itself."""
    with transaction.atomic():
        membership = (OperatorMembership.objects.select_for_update().select_related("user")
                      .filter(operator=operator, pk=membership_id).first())
        if membership is None:
            raise NotFound("member not found")
        admins = OperatorMembership.objects.filter(operator=operator, role=MembershipRole.ADMIN)
        if membership.is_admin and admins.count() <= 1:
            raise Conflict("This is the team's only admin; invite another admin first.")
        audit_record(actor=actor, action=AuditAction.PORTAL_MEMBERSHIP_REMOVE, target=membership, operator=operator,
                     data={"username": membership.user.get_username(), "role": membership.role})
        membership.delete()
    return membership
