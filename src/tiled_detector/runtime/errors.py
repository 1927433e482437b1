"""How errors reach a user: one line, at the process boundary (the CLI and the node)."""

from __future__ import annotations


def one_line(error: BaseException) -> str:
    """The first line of an error's message (native libraries add pages of context), with its type when
    the message alone says little."""
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    generic = not text or isinstance(error, KeyError | IndexError | AttributeError | TypeError)
    return f"{type(error).__name__}: {text}" if generic else text
