"""The API's JSON parser: DRF's, plus a refusal of bodies nested too deeply to decode.

A small body such as ``[[[[...]]]]`` makes the standard decoder raise ``RecursionError``, which DRF
does not catch (a 500). Here it is a 400 like any other unusable body.
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

__all__ = ["SafeJSONParser"]


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
