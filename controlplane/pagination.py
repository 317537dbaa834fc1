"""The API's one pagination: limit/offset with a ceiling.

DRF's ``LimitOffsetPagination`` has no maximum, so ``?limit=99999999999999999999`` reached
PostgreSQL as an out-of-range bigint (a 500). Here any limit above ``MAX_LIMIT`` is clamped.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

__all__ = ["BoundedLimitOffsetPagination", "MAX_LIMIT"]

MAX_LIMIT = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_offset(self, request):  # type: ignore[no-untyped-def]
        # Offsets beyond any real table are clamped too (an out-of-range bigint is a database error).
        return min(super().get_offset(request), 2**62)
