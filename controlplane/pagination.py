"""The API's paginations, each with a ceiling: limit/offset, and cursors for the lists that grow without end.

DRF's ``LimitOffsetPagination`` has no maximum, so ``?limit=99999999999999999999`` reached
PostgreSQL as an out-of-range bigint (a 500). Here any limit above ``MAX_LIMIT`` is clamped.
"""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination, LimitOffsetPagination

from .errors import ValidationFailed

__all__ = ["BoundedLimitOffsetPagination", "BoundedCursorPagination", "MAX_LIMIT"]

MAX_LIMIT = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):  # type: ignore[no-untyped-def]
        return _limit(request, self.limit_query_param, super().get_limit(request))

    def get_offset(self, request):  # type: ignore[no-untyped-def]
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

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = MAX_LIMIT
    query_params = ("cursor", "limit")

    def get_page_size(self, request):  # type: ignore[no-untyped-def]
        return _limit(request, self.page_size_query_param, super().get_page_size(request))

    def decode_cursor(self, request):  # type: ignore[no-untyped-def]
        try:
            return super().decode_cursor(request)
        except NotFound:  # DRF answers a bad cursor with 404, as if the list were gone: it is bad input
            raise ValidationFailed("cursor is not one this API gave out (follow `next` or `previous`)") from None


def _limit(request, name: str, default: int | None) -> int | None:  # type: ignore[no-untyped-def]
    """``limit=abc`` or ``limit=0`` is a 400, not silently the default page; a huge limit is clamped."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValidationFailed(f"{name} must be a whole number from 1 to {MAX_LIMIT}")
    return min(int(raw), MAX_LIMIT)
