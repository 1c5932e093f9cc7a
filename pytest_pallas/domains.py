"""``@supports(...)``: an implementation declares the part of an op's domain it handles.

    from pytest_pallas import supports

    @supports(dtypes=("float32", "bfloat16"), multiple_of={"s": 128, "t": 128})
    def my_mha(q, k, v): ...

The conformance suite then draws inputs only inside that domain and lists
the restriction in its report. Dimension names are checked against the op
when the suite binds the implementation to it (``Domain.validate_for``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_ATTRIBUTE = "__pallas_supports__"
_KEYS = ("dtypes", "multiple_of", "max_size")


class SupportsError(ValueError):
    """A ``@supports`` declaration that does not fit the op it is used for."""


@dataclasses.dataclass(frozen=True)
class Domain:
    dtypes: tuple[str, ...] | None = None
    multiple_of: Mapping[str, int] = dataclasses.field(default_factory=dict)
    max_size: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def validate_for(
        self, op_name: str, dimensions: Sequence[str], op_dtypes: Sequence[str]
    ) -> None:
        """Raise ``SupportsError`` naming any dimension or dtype the op does not have."""
        for key, mapping in (("multiple_of", self.multiple_of), ("max_size", self.max_size)):
            for dim in mapping:
                if dim not in dimensions:
                    raise SupportsError(
                        f"@supports({key}={{{dim!r}: ...}}): op {op_name!r} has no dimension "
                        f"{dim!r}; its dimensions are {', '.join(dimensions)}."
                    )
        if self.dtypes is not None:
            unknown = [d for d in self.dtypes if d not in op_dtypes]
            if unknown:
                raise SupportsError(
                    f"@supports(dtypes=...): op {op_name!r} is not drawn in {', '.join(unknown)}; "
                    f"its dtypes are {', '.join(op_dtypes)}."
                )

    def describe(self) -> str:
        parts = []
        if self.dtypes is not None:
            parts.append(f"dtypes={','.join(self.dtypes)}")
        parts += [f"{dim}%{n}==0" for dim, n in self.multiple_of.items()]
        parts += [f"{dim}<={n}" for dim, n in self.max_size.items()]
        return "; ".join(parts) or "none"

    def as_dict(self) -> dict[str, Any]:
        return {
            "dtypes": list(self.dtypes) if self.dtypes is not None else None,
            "multiple_of": dict(self.multiple_of),
            "max_size": dict(self.max_size),
        }


def _int_mapping(key: str, value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SupportsError(f"@supports({key}=...) takes a dict of dimension name -> int, "
                            f"got {type(value).__name__}.")
    result = {}
    for dim, number in value.items():
        if not isinstance(dim, str) or isinstance(number, bool) or not isinstance(number, int) \
                or number < 1:
            raise SupportsError(
                f"@supports({key}={{{dim!r}: {number!r}}}): give a dimension name and a "
                "positive int."
            )
        result[dim] = number
    return result


def supports(**declaration: Any) -> Callable[[Callable], Callable]:
    """Declare the inputs an implementation supports: ``dtypes``, ``multiple_of``, ``max_size``."""
    unknown = sorted(set(declaration) - set(_KEYS))
    if unknown:
        raise SupportsError(
            f"@supports got unknown key(s) {', '.join(unknown)}; it takes {', '.join(_KEYS)}."
        )
    dtypes = declaration.get("dtypes")
    if dtypes is not None:
        if isinstance(dtypes, str) or not all(isinstance(d, str) for d in dtypes) or not dtypes:
            raise SupportsError(
                "@supports(dtypes=...) takes a non-empty tuple of dtype names, "
                "e.g. dtypes=('float32', 'bfloat16')."
            )
        dtypes = tuple(dtypes)
    domain = Domain(
        dtypes=dtypes,
        multiple_of=_int_mapping("multiple_of", declaration.get("multiple_of")),
        max_size=_int_mapping("max_size", declaration.get("max_size")),
    )

    def decorate(function: Callable) -> Callable:
        setattr(function, _ATTRIBUTE, domain)
        return function

    return decorate


def declared_domain(function: Callable) -> Domain:
    """The domain ``function`` declared with ``@supports``, or the whole op's (``Domain()``)."""
    return getattr(function, _ATTRIBUTE, None) or Domain()
