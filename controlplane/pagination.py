"""The API's paginations, each with a ceiling: limit/offset, and cursors for the lists that grow without end.

DRF's ``LimitOffsetPagination`` has no maximum, so ``?limit=99999999999999999999`` reached
PostgreSQL as an out-of-range bigint (a 500). Here a limit outside 1..``MAX_LIMIT`` is a 400.
"""

from __future__ import annotations

from rest_framework.exceptions import NotFound as DRFNotFound
from rest_framework.pagination import CursorPagination, LimitOffsetPagination

from .errors import NotFound, ValidationFailed

__all__ = ["BoundedLimitOffsetPagination", "BoundedCursorPagination", "MAX_LIMIT"]

MAX_LIMIT = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        return _limit(request, self.limit_query_param, super().get_limit(request))

    def get_offset(self, request):
        raw = request.query_params.get(self.offset_query_param)
        if raw is not None and not (raw.isascii() and raw.isdigit()):
            raise ValidationFailed(f"{self.offset_query_param} must be a whole number of at least 0")
        # Offsets beyond any real table are clamped too (an out-of-range bigint is a database error).
        return min(super().get_offset(request), 2**62)


class BoundedCursorPagination(CursorPagination):
    """Keyset pages (``?cursor=``): stable while rows are added, and as fast on page 1,000 as on page 1.

    Newest first by ``created_at``; ``limit`` sets the page size, clamped to ``MAX_LIMIT``. The cursor is
    opaque (DRF signs nothing, but it only encodes a position and an offset within equal timestamps).
    """

    ordering: str | tuple[str, ...] = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = MAX_LIMIT
    query_params = ("cursor", "limit")

    def get_page_size(self, request):
        return _limit(request, self.page_size_query_param, super().get_page_size(request))

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except DRFNotFound:  # 404 as DRF has it (no such page), but saying what to do, as problem+json
            raise NotFound("cursor is not one this API gave out (follow `next` or `previous`)") from None

    def get_schema_operation_parameters(self, view):
        from .openapi import limit_parameter

        params = super().get_schema_operation_parameters(view)
        bounded = limit_parameter(MAX_LIMIT, self.page_size)
        for param in params:
            if param["name"] == self.page_size_query_param:
                param["schema"], param["description"] = dict(bounded.type), bounded.description
            if param["name"] == self.cursor_query_param:
                param["description"] = "Opaque: a page's `next` or `previous` link carries it."
        return params


def _limit(request, name: str, default: int | None) -> int | None:
    """``limit=abc``, ``limit=0`` or ``limit=501`` is a 400 naming the bounds, not silently another page size
    (and never a bigint PostgreSQL cannot hold)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValidationFailed(f"{name} must be a whole number from 1 to {MAX_LIMIT}")
    return int(raw)
