"""`ast.parse` for tests that read the project's own source, proof against an interpreter bug.

CPython 3.11's AST constructor can fail a sound parse with `SystemError: AST constructor recursion depth mismatch`
(python/cpython#106905: an error path in the generated AST code skipped its depth bookkeeping; reported from
threaded programs, which a pytest worker running live servers is). CI met it once, on
`test_audit_actions.py` parsing `provisioning/databases/move.py`, a file that parses on every other run. The same
source parsed again gives the tree; any other error, and this one three times running, is raised.
"""

from __future__ import annotations

import ast

__all__ = ["parse"]

_MISMATCH = "AST constructor recursion depth mismatch"


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(3):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as exc:
            if _MISMATCH not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
