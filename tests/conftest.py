"""The two tiers of the suite, and how many examples the Hypothesis tests draw in each.

The default tier (`python -m pytest`) is the loop to run before every commit; the slow tier
(`python -m pytest -m slow`) is the rest: the long sweeps, the compiles of every template and schedule,
most of the editor's tests (see tests/app/conftest.py), and the Hypothesis tests at their full counts.
A test goes to the slow tier with `@pytest.mark.slow`, a case of a parametrisation with
`pytest.param(..., marks=pytest.mark.slow)` (tests/tiers.py has helpers). CI runs both tiers, each in a
process per core (pytest-xdist's `-n auto`, as the README's commands): a test must not depend on another
having run in its process first.
pyproject.toml's addopts deselect the slow tier (`-m "not slow"`); a `-m` on the command line replaces
that one (`-m slow`, `-m gpu`, or `-m ""` for everything at once).

Hypothesis: every test with `@given` runs twice, as `test[dev]` and `test[full]`.

- `[dev]`, in the default tier, runs the "dev" profile: at most DEV_EXAMPLES examples, the test's other
  settings as its `@settings` gives them.
- `[full]`, in the slow tier, runs the "full" profile: the counts the test's `@settings` asks for.

CELLFUSE_HYPOTHESIS=full makes the `[dev]` runs draw the full counts too (for a default-tier run that
searches as hard as CI's slow tier); CELLFUSE_HYPOTHESIS=dev, or unset, gives the above. A Hypothesis
test that is marked slow itself runs once, at its full count.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import is_hypothesis_test, settings

DEV_EXAMPLES = 10

settings.register_profile("dev", max_examples=DEV_EXAMPLES)
settings.register_profile("full")  # Hypothesis's defaults; each test's @settings gives its own count

PROFILE_PARAM = "hypothesis_profile"


def _dev_profile() -> str:
    profile = os.environ.get("CELLFUSE_HYPOTHESIS", "dev") or "dev"
    if profile not in ("dev", "full"):
        raise pytest.UsageError(f"CELLFUSE_HYPOTHESIS={profile!r}: use 'dev' or 'full'")
    return profile


def pytest_configure(config):
    _dev_profile()  # a wrong value stops the run before anything is collected


def pytest_generate_tests(metafunc):
    if not is_hypothesis_test(metafunc.function) or metafunc.definition.get_closest_marker("slow"):
        return
    metafunc.fixturenames.append(PROFILE_PARAM)
    metafunc.parametrize(PROFILE_PARAM, [pytest.param("dev", id="dev"),
                                         pytest.param("full", id="full", marks=pytest.mark.slow)])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """Runs a `[dev]` item under the dev profile: its own settings, with at most the profile's examples.
    Hypothesis reads a test's settings from the function when it runs, so they are set for this call and
    put back after it (the `[full]` item runs the same function)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or callspec.params.get(PROFILE_PARAM) != "dev" or _dev_profile() == "full":
        return (yield)
    test = item.obj
    own = test._hypothesis_internal_use_settings
    cap = settings.get_profile("dev").max_examples
    test._hypothesis_internal_use_settings = settings(own, max_examples=min(own.max_examples, cap))
    try:
        return (yield)
    finally:
        test._hypothesis_internal_use_settings = own
