"""Operator portal: the operator's own model prices (``usage.ModelPrice``) beside the platform defaults.

Every member reads the page (the trace view's and usage export's costs come from it); admins add, change and
delete their operator's rows through ``usage.price_services`` (audited). The platform defaults are shown read-only:
staff set them in the Django admin. Rows are always looked up within ``request.operator``, so another operator's
price is a 404 for every method, even by id.
"""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.validators import RegexValidator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from controlplane.errors import NotFound, ValidationFailed
from tenants.actors import Actor
from tenants.choices import ActorKind
from usage.models import ModelPrice
from usage.price_services import model_price_create, model_price_delete, model_price_get, model_price_update
from usage.pricing import format_usd

from .views import member_required

__all__ = ["prices", "price_edit", "price_delete"]

_PRICE_HELP = "USD per million tokens, up to six decimals (e.g. 0.15)."


def _price_field(label: str) -> forms.DecimalField:
    # The column's own bounds (max_digits 12, 6 decimals, not negative), so the form refuses what the table would.
    return forms.DecimalField(label=label, min_value=Decimal(0), max_digits=12, decimal_places=6, help_text=_PRICE_HELP)


class PriceValuesForm(forms.Form):
    input_usd_per_mtok = _price_field("Input (prompt) price")
    output_usd_per_mtok = _price_field("Output (completion) price")


class PriceForm(PriceValuesForm):
    # Exactly as the spans name it: no surrounding or inner whitespace, printable characters only.
    model = forms.CharField(max_length=200, label="Model", validators=[RegexValidator(
        r"^[\x21-\x7e]+$", "A model name as your spans name it: letters, digits and punctuation, no spaces.")],
        help_text="Exactly as the spans name it (gen_ai.response.model), e.g. gpt-4o-mini-2024-07-18.")
    field_order = ["model", "input_usd_per_mtok", "output_usd_per_mtok"]


def _actor(request: HttpRequest) -> Actor:
    operator = request.operator
    return Actor(kind=ActorKind.USER, id=str(request.user.pk),
                 label=f"{request.user.get_username()} via {operator.slug} portal", operator_id=str(operator.pk))


def _row(price: ModelPrice) -> dict[str, object]:
    return {"pk": price.pk, "model": price.model, "updated_at": price.updated_at,
            "input": format_usd(price.input_usd_per_mtok), "output": format_usd(price.output_usd_per_mtok)}


def _list_page(request: HttpRequest, *, form: PriceForm | None = None, status: int = 200) -> HttpResponse:
    own = [_row(p) for p in ModelPrice.objects.filter(operator=request.operator).order_by("model")]
    overridden = {row["model"] for row in own}
    defaults = [{**_row(p), "overridden": p.model in overridden}
                for p in ModelPrice.objects.filter(operator__isnull=True).order_by("model")]
    return render(request, "portal/prices.html", {
        "own": own, "defaults": defaults, "form": form if form is not None else PriceForm(),
        "can_edit": request.membership.is_admin, "nav": "prices"}, status=status)


@require_http_methods(["GET", "POST"])
@member_required()
def prices(request: HttpRequest) -> HttpResponse:
    """The list and the add form; a refused form comes back with each message next to its field (400)."""
    if request.method == "GET":
        return _list_page(request)
    if not request.membership.is_admin:
        raise PermissionDenied("operator admins only")
    form = PriceForm(request.POST)
    if not form.is_valid():
        return _list_page(request, form=form, status=400)
    try:
        price = model_price_create(operator=request.operator, actor=_actor(request), **form.cleaned_data)
    except ValidationFailed as exc:
        form.add_error(exc.extra.get("field"), exc.detail)
        return _list_page(request, form=form, status=400)
    messages.success(request, f"Price for {price.model} saved: it applies to your customers from now on.")
    return redirect("portal:prices")


def _own_price(request: HttpRequest, price_id: int) -> ModelPrice:
    try:
        return model_price_get(operator=request.operator, price_id=price_id)
    except NotFound:
        raise Http404("price not found") from None


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def price_edit(request: HttpRequest, price_id: int) -> HttpResponse:
    price = _own_price(request, price_id)
    if request.method == "GET":
        form = PriceValuesForm(initial={"input_usd_per_mtok": price.input_usd_per_mtok,
                                        "output_usd_per_mtok": price.output_usd_per_mtok})
        return render(request, "portal/price_edit.html", {"price": price, "form": form, "nav": "prices"})
    form = PriceValuesForm(request.POST)
    if not form.is_valid():
        return render(request, "portal/price_edit.html", {"price": price, "form": form, "nav": "prices"},
                      status=400)
    try:
        model_price_update(operator=request.operator, price_id=price.pk, actor=_actor(request), **form.cleaned_data)
    except NotFound:
        raise Http404("price not found") from None
    messages.success(request, f"Price for {price.model} changed.")
    return redirect("portal:prices")


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def price_delete(request: HttpRequest, price_id: int) -> HttpResponse:
    """A confirmation page, then the POST (CSRF) deletes: the customers fall back to the platform default."""
    price = _own_price(request, price_id)
    if request.method == "GET":
        return render(request, "portal/confirm.html", {
            "title": f"Delete your price for {price.model}?", "button": "Delete price",
            "cancel": reverse("portal:prices"), "nav": "prices",
            "explain": "Your customers' costs for this model then use the platform's default price, or show no "
                       "cost when there is none. Costs already exported are not changed."})
    try:
        model_price_delete(operator=request.operator, price_id=price.pk, actor=_actor(request))
    except NotFound:
        raise Http404("price not found") from None
    messages.success(request, f"Price for {price.model} deleted.")
    return redirect("portal:prices")
