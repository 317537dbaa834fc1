# The Choices enums as django-stubs declares them (see typings/README.md); nothing else of Django here.
import enum
from typing import Any

class ChoicesType(enum.EnumMeta):
    @property
    def choices(cls) -> list[tuple[Any, str]]: ...
    @property
    def labels(cls) -> list[str]: ...
    @property
    def values(cls) -> list[Any]: ...
    @property
    def names(cls) -> list[str]: ...

class Choices(enum.Enum, metaclass=ChoicesType):
    @property
    def label(self) -> str: ...

class IntegerChoices(int, Choices):
    @property
    def value(self) -> int: ...

class TextChoices(str, Choices):
    @property
    def value(self) -> str: ...
