"""The tile schedule under a budget (`tracking.schedule`): property tests of its rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.pipeline.tiling import plan_tiles
from tiled_detector.tracking.schedule import ScheduleKind, alternative, claims, due, schedule, smallest_budget


@st.composite
def streams(draw):
    tiles = draw(st.integers(1, 40))
    max_age = draw(st.integers(1, 8))
    budget = draw(st.integers(smallest_budget(tiles, max_age), tiles))
    frames = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    return tiles, max_age, budget, frames, np.random.default_rng(seed)


@settings(max_examples=200, deadline=None)
@given(stream=streams())
def test_the_age_bound_always_holds_and_the_rest_goes_by_need(stream):
    tiles, max_age, budget, frames, rng = stream
    ages = np.ones(tiles, np.int64)  # every tile ran on the frame before (a stream's first frame runs all)
    for _ in range(frames):
        claimed = rng.integers(0, 3, tiles) * (rng.random(tiles) < rng.random())
        chosen = schedule(ages, claimed, budget, max_age)
        assert len(chosen) <= budget and np.array_equal(chosen, np.unique(chosen))
        assert np.array_equal(chosen, schedule(ages.copy(), claimed.copy(), budget, max_age))  # deterministic
        assert set(np.flatnonzero(ages >= max_age)) <= set(chosen.tolist())  # a tile at the bound runs now
        must = set(due(ages, budget, max_age).tolist())
        assert must <= set(chosen.tolist())
        # beyond the due tiles, the budget goes to the tiles of most need: claims x age squared, then age
        need = claimed * ages**2 * (max_age + 1) + ages
        rest = np.array(sorted(set(chosen.tolist()) - must), np.int64)
        left = np.setdiff1d(np.arange(tiles), chosen)
        if len(rest) and len(left):
            assert need[rest].min() >= need[left].max()
        ages += 1
        ages[chosen] = 1
        assert ages.max() <= max_age  # no tile waits longer than the bound


def test_a_budget_below_the_smallest_is_refused_with_the_smallest():
    assert smallest_budget(33, 4) == 9 and smallest_budget(32, 4) == 8 and smallest_budget(1, 4) == 1
    with pytest.raises(ValueError, match="the smallest that can is 8"):
        schedule(np.full(32, 4), np.zeros(32), 7, 4)
    assert schedule(np.full(32, 4), np.zeros(32), 40, 4).tolist() == list(range(32))  # a budget >= N: all


def test_claims_count_the_tiles_a_grown_box_touches_and_a_seam_box_claims_both():
    tiles = plan_tiles(1080, 1920, 640, 640, 0.2)  # 2 rows x 4 columns
    inside = [100, 100, 130, 130]  # well inside tile 0
    seam = [500, 200, 540, 240]  # across the seam of tiles 0 and 1 (x 512..640 is in both)
    got = claims(tiles, np.array([inside, seam], float))
    assert got[0] == 2 and got[1] == 1 and got.sum() == 3
    assert claims(tiles, np.zeros((0, 4))).tolist() == [0] * len(tiles)


def test_tiles_go_by_claims_and_age():
    """Claims x age squared ([0, 2, 0, 0, 0, 1] here; [0, 2, 3, 0, 0, 1] with one more claim on the old tile 2),
    then tiles without claims by age: the claimed tiles first, an old tile with a claim before a fresh one with
    two, then the oldest tile without tracks."""
    ages = np.array([1, 1, 3, 2, 1, 1])
    claimed = np.array([0, 2, 0, 0, 0, 1])
    assert schedule(ages, claimed, 2, 10).tolist() == [1, 5]
    assert schedule(ages, claimed, 3, 10).tolist() == [1, 2, 5]
    assert schedule(ages, claimed, 4, 10).tolist() == [1, 2, 3, 5]
    claimed[2] = 1
    assert schedule(ages, claimed, 1, 10).tolist() == [2]


def test_new_view_runs_after_the_due_tiles_and_before_the_claimed() -> None:
    ages = np.array([4, 1, 1, 1, 1, 1])
    claimed = np.array([0, 3, 0, 0, 0, 0])
    fresh = np.array([0, 0, 0.5, 0, 0.05, 0])
    assert schedule(ages, claimed, 2, 4, fresh).tolist() == [0, 2]
    assert schedule(ages, claimed, 3, 4, fresh).tolist() == [0, 1, 2]
    assert schedule(ages, claimed, 2, 4).tolist() == [0, 1]


def test_the_alternatives_run_the_same_tiles_per_frame() -> None:
    """Every tile on one frame in k, none between (k = 32 / 12 = 2.67: gaps of 2 and 3 frames); round robin visits
    every tile in turn; both at the budget's mean tiles per frame."""
    tiles, budget = 32, 8
    interval = [alternative(ScheduleKind.INTERVAL, f, tiles, budget) for f in range(8)]
    assert [len(x) for x in interval] == [0, 0, 0, 32, 0, 0, 0, 32]
    uneven = [len(alternative(ScheduleKind.INTERVAL, f, tiles, 12)) for f in range(8)]
    assert uneven == [0, 0, 32, 0, 0, 32, 0, 32] and sum(uneven) == 8 * 12
    rounds = [alternative(ScheduleKind.ROUND_ROBIN, f, tiles, budget) for f in range(4)]
    assert all(len(r) == budget for r in rounds) and sorted(np.concatenate(rounds).tolist()) == list(
        range(32)
    )
    with pytest.raises(ValueError, match="not an alternative"):
        alternative(ScheduleKind.TRACKS, 0, tiles, budget)
