"""Parametrisations split between the two tiers of the suite (see tests/conftest.py): a few cases in the
default tier, the others marked slow."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest


def slow_where(values: Iterable[Any], slow: Callable[[Any], bool]) -> list[Any]:
    """The values, those for which `slow` holds marked slow."""
    return [pytest.param(v, marks=pytest.mark.slow) if slow(v) else v for v in values]


def slow_beyond(values: Iterable[Any], fast: int) -> list[Any]:
    """The values, all but the first `fast` marked slow."""
    return [pytest.param(v, marks=pytest.mark.slow) if i >= fast else v for i, v in enumerate(values)]
