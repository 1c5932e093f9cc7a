"""``@supports(...)``: an implementation declares the part of an op's domain it handles.

    from pytest_pallas import supports

    @supports(dtypes=("float32", "bfloat16"), multiple_of={"s": 128, "t": 128})
    def my_mha(q, k, v): ...

The conformance suite then draws inputs only inside that domain and lists
the restriction in its report. Dimension names are checked against the op
when the suite binds the implementation to it (``Domain.validate_for``).

``blocks`` declares the block-size keyword arguments an implementation takes, and
the dimension each one blocks, so that the suite can make small inputs take
several grid steps (a kernel whose default blocks span a whole small dimension
never runs its multi-block code otherwise)::

    @supports(blocks={"block_m": "m", "block_k": "k", "block_kv": ("t", 128)})
    def my_kernel(x, y, *, block_m=None, block_k=None, block_kv=None): ...

A block of dimension ``dim`` is a multiple of ``(dim, multiple)``'s multiple, or
by default of the TPU tile of the dimension's kind (128 for a lane or reduction
dimension, the dtype's native sublane count for a sublane one, 1 for a batch-like
one). ``ragged_blocks=False`` says the kernel needs blocks that divide their
dimension; by default a ragged last block is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_ATTRIBUTE = "__pallas_supports__"
_KEYS = ("dtypes", "multiple_of", "max_size", "blocks", "ragged_blocks")


class SupportsError(ValueError):
    """A ``@supports`` declaration that does not fit the op it is used for."""


@dataclasses.dataclass(frozen=True)
class Domain:
    dtypes: tuple[str, ...] | None = None
    multiple_of: Mapping[str, int] = dataclasses.field(default_factory=dict)
    max_size: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # keyword -> (dimension it blocks, required multiple or None for the dimension's tile)
    blocks: Mapping[str, tuple[str, int | None]] = dataclasses.field(default_factory=dict)
    ragged_blocks: bool = True

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
        for keyword, (dim, _) in self.blocks.items():
            if dim not in dimensions:
                raise SupportsError(
                    f"@supports(blocks={{{keyword!r}: {dim!r}}}): op {op_name!r} has no "
                    f"dimension {dim!r}; its dimensions are {', '.join(dimensions)}."
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
            # Only when declared: an implementation without blocks reports as before.
            **({"blocks": {keyword: {"dimension": dim, "multiple": multiple}
                           for keyword, (dim, multiple) in self.blocks.items()},
                "ragged_blocks": self.ragged_blocks} if self.blocks else {}),
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


def _block_mapping(value: Any) -> dict[str, tuple[str, int | None]]:
    if value is None:
        return {}
    example = "e.g. blocks={'block_m': 'm', 'block_kv': ('t', 128)}"
    if not isinstance(value, Mapping):
        raise SupportsError(f"@supports(blocks=...) takes a dict of keyword -> dimension name "
                            f"or (dimension name, multiple), {example}; got "
                            f"{type(value).__name__}.")
    result: dict[str, tuple[str, int | None]] = {}
    for keyword, target in value.items():
        dim, multiple = (target, None) if isinstance(target, str) else (
            tuple(target) if isinstance(target, (tuple, list)) and len(target) == 2
            else (None, None))
        if not isinstance(keyword, str) or not keyword.isidentifier() \
                or not isinstance(dim, str) or (multiple is not None and (
                    isinstance(multiple, bool) or not isinstance(multiple, int)
                    or multiple < 1)):
            raise SupportsError(f"@supports(blocks={{{keyword!r}: {target!r}}}): give a keyword "
                                f"and a dimension name or (dimension name, positive int), "
                                f"{example}.")
        result[keyword] = (dim, multiple)
    return result


def supports(**declaration: Any) -> Callable[[Callable], Callable]:
    """Declare the inputs an implementation supports: ``dtypes``, ``multiple_of``, ``max_size``,
    and the block-size keywords it takes (``blocks``, ``ragged_blocks``)."""
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
        blocks=_block_mapping(declaration.get("blocks")),
        ragged_blocks=bool(declaration.get("ragged_blocks", True)),
    )

    def decorate(function: Callable) -> Callable:
        setattr(function, _ATTRIBUTE, domain)
        return function

    return decorate


def declared_domain(function: Callable) -> Domain:
    """The domain ``function`` declared with ``@supports``, or the whole op's (``Domain()``)."""
    return getattr(function, _ATTRIBUTE, None) or Domain()
