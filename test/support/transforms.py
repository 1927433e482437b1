"""Camera motions for tests: similarities by their parameters, and their composition."""

from __future__ import annotations

import math

import numpy as np


def compose(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """The (2, 3) transform that applies `first`, then `then`."""
    return (np.vstack([then, [0, 0, 1]]) @ np.vstack([first, [0, 0, 1]]))[:2]


def similarity(scale: float, degrees: float, tx: float, ty: float) -> np.ndarray:
    """The (2, 3) similarity: scale, rotation (degrees), translation."""
    a, b = scale * math.cos(math.radians(degrees)), scale * math.sin(math.radians(degrees))
    return np.array([[a, -b, tx], [b, a, ty]])
