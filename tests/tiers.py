"""Parametrisations split between the two tiers of the suite (see tests/conftest.py): a few cases in the
default tier, the others marked slow. For a parametrisation of several names, give the values as tuples
and `several=True`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest


def _slow(value: Any, several: bool) -> Any:
    return pytest.param(*value, marks=pytest.mark.slow) if several else pytest.param(value,
                                                                                     marks=pytest.mark.slow)


def slow_where(values: Iterable[Any], slow: Callable[..., bool], several: bool = False) -> list[Any]:
    """The values, those for which `slow` holds (given the value, or a tuple's items) marked slow."""
    return [_slow(v, several) if (slow(*v) if several else slow(v)) else v for v in values]


def slow_beyond(values: Iterable[Any], fast: int, several: bool = False) -> list[Any]:
    """The values, all but the first `fast` marked slow."""
    return [_slow(v, several) if i >= fast else v for i, v in enumerate(values)]
