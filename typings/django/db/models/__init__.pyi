# A stand-in for django-stubs (see typings/README.md): every name is Any except the slices declared here.
from typing import Any

from .enums import Choices as Choices
from .enums import IntegerChoices as IntegerChoices
from .enums import TextChoices as TextChoices

def __getattr__(name: str) -> Any: ...
