"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


@st.composite
def box_pairs(draw) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of 0-25 boxes (x1, y1, x2, y2) of 1-60 px in a 260 px square."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    n, m = draw(st.integers(0, 25)), draw(st.integers(0, 25))
    a = rng.uniform(0, 200, (n, 2))
    b = rng.uniform(0, 200, (m, 2))
    a = np.concatenate([a, a + rng.uniform(1, 60, (n, 2))], axis=1)
    b = np.concatenate([b, b + rng.uniform(1, 60, (m, 2))], axis=1)
    return a, b
