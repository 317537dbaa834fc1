"""Writes of an operator's own model prices (``usage.ModelPrice`` rows with an operator), for the portal.

Each write is audited in its own transaction with the acting member. The platform defaults (rows without an
operator) are staff's and are not written here: staff edit them in the Django admin. Every function takes the
operator and looks rows up within it, so one operator can never reach another's row, even by id.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import IntegrityError, transaction

from controlplane.errors import NotFound, ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator

from .models import ModelPrice

__all__ = ["model_price_create", "model_price_delete", "model_price_get", "model_price_update"]


def model_price_get(*, operator: Operator, price_id: int) -> ModelPrice:
    """The operator's own row ``price_id``; another operator's row, or a platform default, is NotFound."""
    price = ModelPrice.objects.filter(operator=operator, pk=price_id).first()
    if price is None:
        raise NotFound("no such price")
    return price


def _prices(price: ModelPrice) -> dict[str, str]:
    return {"model": price.model, "input_usd_per_mtok": str(price.input_usd_per_mtok),
            "output_usd_per_mtok": str(price.output_usd_per_mtok)}


def model_price_create(*, operator: Operator, model: str, input_usd_per_mtok: Decimal,
                       output_usd_per_mtok: Decimal, actor: Actor) -> ModelPrice:
    """The operator's price for ``model`` (it then wins over the platform default for its customers). One row per
    operator and model: a second is refused rather than silently replacing the first."""
    try:
        with transaction.atomic():
            price = ModelPrice.objects.create(operator=operator, model=model, input_usd_per_mtok=input_usd_per_mtok,
                                              output_usd_per_mtok=output_usd_per_mtok)
            audit_record(actor=actor, action=AuditAction.MODEL_PRICE_CREATE, target=price, operator=operator,
                         data=_prices(price))
    except IntegrityError:
        raise ValidationFailed("You already have a price for this model: change it from the list.",
                               extra={"field": "model"}) from None
    return price


def model_price_update(*, operator: Operator, price_id: int, input_usd_per_mtok: Decimal,
                       output_usd_per_mtok: Decimal, actor: Actor) -> ModelPrice:
    """New prices for one of the operator's rows (the model name stays: a price for another model is a new row)."""
    with transaction.atomic():
        price = ModelPrice.objects.select_for_update().filter(operator=operator, pk=price_id).first()
        if price is None:
            raise NotFound("no such price")
        before = _prices(price)
        price.input_usd_per_mtok, price.output_usd_per_mtok = input_usd_per_mtok, output_usd_per_mtok
        price.save(update_fields=["input_usd_per_mtok", "output_usd_per_mtok", "updated_at"])
        audit_record(actor=actor, action=AuditAction.MODEL_PRICE_UPDATE, target=price, operator=operator,
                     data={**_prices(price), "before": before})
    return price


def model_price_delete(*, operator: Operator, price_id: int, actor: Actor) -> None:
    """Remove one of the operator's rows: its customers fall back to the platform default (or to no price)."""
    with transaction.atomic():
        price = ModelPrice.objects.select_for_update().filter(operator=operator, pk=price_id).first()
        if price is None:
            raise NotFound("no such price")
        audit_record(actor=actor, action=AuditAction.MODEL_PRICE_DELETE, target=price, operator=operator,
                     data=_prices(price))
        price.delete()
