"""Models read by one parameterised statement on a hot path, where building the ORM's query costs more CPU than its
round trip (issue 39: a `select_related` lookup compiles in ~0.7 ms on a slow machine, the statement runs in ~0.2).

`model_columns` names a model's concrete columns under a table alias, from the model's own metadata (so the
statement follows a migration that adds a column); `model_row` builds the instance from its slice of a row, as the
ORM would: each value through its field's converters (a JSON field arrives as text from Django's cursor and is
parsed here, as the ORM's compiler does), then `Model.from_db` (loaded state, no save needed). Only names from
metadata are formatted into SQL; every value stays a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection, models

__all__ = ["model_columns", "model_row"]

M = TypeVar("M", bound=models.Model)


@cache
def model_columns(model: type[models.Model], alias: str) -> tuple[tuple[str, ...], str]:
    """(the model's concrete attribute names, its columns under `alias` for a SELECT list), in the same order.
    Built once per model and alias: a model's fields do not change while the process runs."""
    fields = tuple(f.attname for f in model._meta.concrete_fields)
    cols = ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)
    return fields, cols


def model_row(model: type[M], fields: Sequence[str], row: Sequence[Any], start: int = 0) -> M:
    """`model` from `row[start:start + len(fields)]` (`fields` from `model_columns`)."""
    values = list(row[start:start + len(fields)])
    for i, field, convert in _converters(model):  # type: ignore[arg-type]  # a class is hashable
        values[i] = convert(values[i], field, connection)
    return model.from_db("default", fields, values)


@cache
def _converters(model: type[models.Model]) -> list[tuple[int, Any, Callable[..., Any]]]:
    """(position, field, converter) for each of the model's fields that converts what the database sends."""
    return [(i, field, convert) for i, field in enumerate(model._meta.concrete_fields)
            for convert in field.get_db_converters(connection)]
