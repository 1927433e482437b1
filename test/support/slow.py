"""The suite's time rule: no test slower than `LIMIT_S` seconds without a reason in its docstring (or, where its
setup alone takes that long, in the docstring of a fixture it uses: a slow shared setup). conftest.py lists, at the
end of every run, each test over the limit and its reason, or that it has none: a terminal summary section, never a
failure (timing must not decide a test)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

LIMIT_S = 60.0
# the word that starts a reason in a docstring: "Slow: <why it cannot be faster>"
MARK = "Slow:"


def reason(docstrings: Iterable[str | None]) -> str | None:
    """The first "Slow: ..." sentence of the docstrings (a test's, then its fixtures'), on one line; None if none."""
    for doc in docstrings:
        text = " ".join((doc or "").split())
        start = text.find(MARK)
        if start >= 0:
            return text[start:].split(". ")[0].rstrip(".")
    return None


def explained(own: str | None, fixtures: str | None, setup_s: float, limit: float = LIMIT_S) -> str | None:
    """A test's reason: its own docstring's, else its fixtures' where its setup and teardown alone exceed `limit`
    (a fixture explains the time it takes, not the test's own)."""
    return own or (fixtures if setup_s > limit else None)


def report(
    seconds: Mapping[str, float], reasons: Mapping[str, str | None], limit: float = LIMIT_S
) -> list[str]:
    """One line per test over `limit` (setup + call + teardown), slowest first: its time and its reason, or
    "NO REASON" for one whose docstrings give none."""
    slow = sorted((s, test) for test, s in seconds.items() if s > limit)
    return [
        f"{s:7.1f}s {test}: {reasons.get(test) or 'NO REASON (docstring has no ' + MARK + ')'}"
        for s, test in slow[::-1]
    ]
