"""A one-line progress bar for long subcommands (build-engine, bench)."""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any, TextIO


class TextProgress:
    """A one-line progress bar on a stream (tqdm's when tqdm is installed) fed by (phase, done, total)."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.stream, self.width = stream, width
        self._tqdm = importlib.util.find_spec("tqdm") is not None
        self._bars: dict[str, Any] = {}
        self._start = time.monotonic()

    def __call__(self, phase: str, done: int, total: int) -> None:
        """Report `done` of `total` steps of `phase`."""
        if self._tqdm:
            self._tqdm_update(phase, done, total)
            return
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self._start
        end = "\n" if done >= total else ""
        self.stream.write(f"\r[{bar}] {done}/{total} {phase[:40]:<40} {elapsed:6.0f}s{end}")
        self.stream.flush()

    def _tqdm_update(self, phase: str, done: int, total: int) -> None:
        from tqdm import tqdm

        bar = self._bars.get(phase)
        if bar is None:
            bar = self._bars[phase] = tqdm(total=total, desc=phase[:40], file=self.stream, leave=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            del self._bars[phase]
