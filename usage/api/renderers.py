"""The CSV export: ``Accept: text/csv`` or ``?format=csv`` on the usage lists.

One header row (``serializers.COLUMNS``), one line per customer and day, ``tokens_by_model`` and
``storage_unmeasured`` as compact JSON.
A problem (401, 403, 404, 400) is still problem+json: a billing script that asked for CSV reads why it got none.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from rest_framework.renderers import BaseRenderer, JSONRenderer

from .serializers import COLUMNS

_JSON_COLUMNS = ("tokens_by_model", "storage_unmeasured")


class UsageCSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        response = (renderer_context or {}).get("response")
        if not isinstance(data, list) or (response is not None and response.status_code >= 400):
            return JSONRenderer().render(data, accepted_media_type, renderer_context)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(COLUMNS)
        for row in data:
            writer.writerow([json.dumps(row[c], sort_keys=True, separators=(",", ":")) if c in _JSON_COLUMNS
                             else ("" if row[c] is None else row[c]) for c in COLUMNS])
        return out.getvalue().encode()
