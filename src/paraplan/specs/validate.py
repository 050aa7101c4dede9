"""Raw dictionaries validated against the spec dataclasses (pydantic), errors as one-line ``SpecError``s naming
the field: pydantic never leaks into the public API."""

from __future__ import annotations

import functools
from dataclasses import fields
from typing import Any

from pydantic import TypeAdapter, ValidationError

from paraplan.errors import SpecError
from paraplan.fileio import clip


def _format_validation_error(prefix: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    msg = first["msg"]
    if first.get("type") == "value_error" and "error" in (first.get("ctx") or {}):
        return f"{prefix.rstrip('.') + ': ' if not loc else prefix + loc + ': '}{first['ctx']['error']}"
    loc = loc or "(root)"
    if first.get("type") == "unexpected_keyword_argument":
        msg = "unknown field"
    return f"{prefix}{loc}: {msg}"


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    """One TypeAdapter per spec class (building one costs milliseconds: a preset listing built 26)."""
    return TypeAdapter(cls)


def validate_fields(cls: type, data: dict[str, Any], prefix: str) -> Any:
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(
            f"{prefix}{clip(unknown[0])}: unknown field (allowed: {', '.join(sorted(allowed))})"
        )
    try:
        return _adapter(cls).validate_python(data, strict=False)
    except ValidationError as err:
        raise SpecError(_format_validation_error(prefix, err)) from None
