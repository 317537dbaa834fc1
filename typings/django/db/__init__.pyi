# A stand-in for django-stubs (see typings/README.md): every name is Any except the slices declared here.
from typing import Any

def __getattr__(name: str) -> Any: ...
