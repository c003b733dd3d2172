"""Seed offsets as sweep specs and results rows write them (``"3-7"``, ``"0,2,5"``, a list of ints): one
reader for the sweep specs and for the reports that check which seeds a committed spec named."""

from __future__ import annotations

from typing import Any

__all__ = ["parse_seed_offsets"]


def parse_seed_offsets(value: Any) -> list[int]:
    """Seed offsets from ``"3-7"``, ``"0,2,5"``, ``"1-2,6"``, an int or a list of ints; sorted, distinct,
    each >= 0. ``parse_seed_offsets("3-5,8") == [3, 4, 5, 8]``."""
    if isinstance(value, bool):
        raise ValueError(f"seed offsets: expected e.g. '3-7', '0,2' or a list of integers, got {value!r}")
    if isinstance(value, int):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = [p.strip() for p in value.split(",") if p.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"seed offsets: expected e.g. '3-7', '0,2' or a list of integers, got {value!r}")
    out: set[int] = set()
    for it in items:
        try:
            if isinstance(it, str) and "-" in it.strip("-"):
                lo, hi = (int(x) for x in it.split("-", 1))
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            elif isinstance(it, bool) or not isinstance(it, (int, str)):
                raise ValueError
            else:
                out.add(int(it))
        except ValueError:
            raise ValueError(f"seed offsets: cannot read {it!r} (use e.g. '3-7', '0,2' or integers)") from None
    if not out or min(out) < 0:
        raise ValueError(f"seed offsets must be integers >= 0, at least one, got {value!r}")
    return sorted(out)
