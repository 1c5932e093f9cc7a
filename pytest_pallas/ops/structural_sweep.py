"""The sweep's structural cases: every value of an op's structural dimensions and params.

The sweep's two shapes fix every dimension of an op's own ``sizes`` (heads, kv heads,
page size, pages per sequence, ...) and its device count, and take its params in turn;
the drawn examples reach the other values only at some seeds. A kernel wrong only on
one of them (a query head reading kv head ``i % g``, visible only with GQA, 1 < g < h; a
page size of 16 hard-coded; a ring walked the wrong way, identical on 2 devices; a
padded-key mask built from the query length, visible only when s != t) then passed or
failed by the seed. So the sweep also runs these cases, the same in every run:

* each value of each structural axis (a dimension of the record's ``sizes``, the device
  count, a param of several values) at least once, on a shifted diagonal (axis ``i``
  takes value ``(j + i) % len`` in case ``j``, so that two axes of one bucket, s and t,
  differ);
* every combination of each pair of ``Operation.sweep_pairs`` that the op's ``constrain``
  keeps (kv heads dividing query heads, s = t under a causal mask);
* case 0 with every other dimension at its smallest size (rows = 1, cols = 1), the
  others at the sweep's ragged size.

Devices stay at most ``SWEEP_DEVICES``: a ring bug shows on 4 as on 8, and 8 simulated
devices cost several times as much; the drawn examples still reach 8.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

SWEEP_DEVICES = 4
# The profiles of the structural cases, in turn: values where a wrong head, page or block
# shows as a wrong result (not attention's near one-hot "offset" logits).
PROFILES = ("normal", "ties", "small")


def structural_axes(op: Any, sizes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple]:
    """Axis -> its values: the dimensions with the record's own sizes (within ``sizes``, the
    domain's and the budget's), the device count and the params of several values."""
    axes: dict[str, tuple] = {}
    for dim in op.dimensions:
        if op.dimension_kind(dim) == "devices":
            axes[dim] = tuple(n for n in sizes[dim] if n <= SWEEP_DEVICES) or sizes[dim][:1]
        elif dim in op.sizes:
            axes[dim] = tuple(sizes[dim])
    axes.update({name: tuple(values) for name, values in op.params.items() if len(values) > 1})
    return axes


def _kept_combinations(op: Any, pair: tuple[str, str], axes: dict[str, tuple],
                       base: Callable[[dict[str, Any]], tuple[dict, dict]]) -> list[tuple]:
    """The combinations of ``pair``'s values that the op's ``constrain`` leaves as they are."""
    kept = []
    for combination in itertools.product(axes[pair[0]], axes[pair[1]]):
        dims, params = base(dict(zip(pair, combination)))
        if dims is None:
            continue
        merged = {**dims, **params}
        if tuple(merged[name] for name in pair) == combination:
            kept.append(combination)
    return kept


def assignments(op: Any, sizes: Mapping[str, tuple[int, ...]],
                ragged: Mapping[str, int]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (dims, params) of each structural case, before ``constrain``.

    ``sizes``: each dimension's sizes inside the domain and the budget; ``ragged``: each
    dimension's size in the sweep's ragged shape.
    """
    axes = structural_axes(op, sizes)
    params_first = {name: values[0] for name, values in op.params.items()}

    def split(values: Mapping[str, Any], smallest: bool) -> tuple[dict, dict]:
        dims = {dim: (sizes[dim][0] if smallest else ragged[dim]) for dim in op.dimensions}
        params = dict(params_first)
        for name, value in values.items():
            (params if name in op.params else dims)[name] = value
        return dims, params

    def inside(dims: Mapping[str, Any]) -> bool:
        # constrain may move a dimension out of the implementation's domain (s = t under a
        # causal mask takes t below a declared multiple): such a case is left out.
        return all(dims[dim] in sizes[dim] or dims[dim] == ragged[dim] for dim in op.dimensions)

    def constrained(values: Mapping[str, Any]) -> tuple[dict | None, dict]:
        dims, params = op.constrained(*split(values, smallest=False))
        return (dims if inside(dims) else None), params

    pairs = [(pair, _kept_combinations(op, pair, axes, constrained))
             for pair in op.sweep_pairs if pair[0] in axes and pair[1] in axes]
    count = max([1, *(len(values) for values in axes.values()),
                 *(len(kept) for _, kept in pairs)])
    cases = []
    for j in range(count):
        values = {axis: options[(j + i) % len(options)]
                  for i, (axis, options) in enumerate(axes.items())}
        for pair, kept in pairs:
            if kept:
                values.update(zip(pair, kept[j % len(kept)]))
        case = split(values, smallest=j == 0)
        if inside(op.constrained(*case)[0]):
            cases.append(case)
    return cases
