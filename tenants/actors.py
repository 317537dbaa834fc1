"""Who is acting: a frozen value passed from views, commands and tasks down to services and the audit log."""

from __future__ import annotations

from dataclasses import dataclass

from .choices import ActorKind

__all__ = ["Actor", "SYSTEM"]


@dataclass(frozen=True)
class Actor:
    kind: str
    id: str = ""
    label: str = ""
    operator_id: str | None = None

    @classmethod
    def for_token(cls, token: object) -> Actor:
        return cls(
            kind=ActorKind.TOKEN,
            id=str(token.id),  # type: ignore[attr-defined]
            label=f"token {token.prefix} of {token.operator.slug}",  # type: ignore[attr-defined]
            operator_id=str(token.operator_id),  # type: ignore[attr-defined]
        )

    @classmethod
    def for_user(cls, user: object) -> Actor:
        return cls(kind=ActorKind.USER, id=str(user.pk), label=str(user))  # type: ignore[attr-defined]


SYSTEM = Actor(kind=ActorKind.SYSTEM, label="system")
