"""The tile schedule under a budget (`tracking.schedule`): property tests of its rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiled_detector.pipeline.tiling import plan_tiles
from tiled_detector.tracking.schedule import ScheduleKind, alternative, claims, schedule, smallest_budget


@st.composite
def streams(draw, max_age=None):
    """(tiles, max_age, budget, frames, rng): a stream of `frames` frames under a budget that can keep the bound."""
    tiles = draw(st.integers(1, 40))
    age_bound = draw(st.integers(1, 8)) if max_age is None else max_age
    budget = draw(st.integers(smallest_budget(tiles, age_bound), tiles))
    frames = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    return tiles, age_bound, budget, frames, np.random.default_rng(seed)


def run_stream(stream, claims_of):
    """Each frame's (ages, claims, chosen tiles) of a stream whose first frame ran every tile; `claims_of(rng,
    tiles)` draws a frame's claims."""
    tiles, max_age, budget, frames, rng = stream
    ages = np.ones(tiles, np.int64)
    for _ in range(frames):
        claimed = claims_of(rng, tiles)
        before = (ages.copy(), claimed.copy())
        chosen = schedule(ages, claimed, budget, max_age)
        # the inputs are left as they were
        assert np.array_equal(ages, before[0]) and np.array_equal(claimed, before[1])
        yield before[0], before[1], chosen
        ages += 1
        ages[chosen] = 1


def some_claims(rng, tiles):
    return rng.integers(0, 3, tiles) * (rng.random(tiles) < rng.random())


def no_claims(rng, tiles):
    return np.zeros(tiles, np.int64)


@settings(max_examples=200, deadline=None)
@given(stream=streams())
def test_every_tile_runs_within_max_age_frames_on_the_whole_budget(stream):
    tiles, max_age, budget, _, _ = stream
    last_run = np.zeros(tiles, np.int64)  # frame 0 ran every tile
    for frame, (ages, claimed, chosen) in enumerate(run_stream(stream, some_claims), start=1):
        assert chosen.tolist() == sorted(set(chosen.tolist())) and set(chosen.tolist()) <= set(range(tiles))
        assert len(chosen) == min(budget, tiles)  # no more than the budget, and none of it left unused
        # the same inputs, the same tiles
        assert np.array_equal(chosen, schedule(ages, claimed, budget, max_age))
        last_run[chosen] = frame
        assert frame - last_run.min() < max_age  # no tile has waited max_age frames
        # a tile older than a chosen one, claimed at least as much, is chosen too
        left = np.setdiff1d(np.arange(tiles), chosen)
        for i in chosen:
            assert not np.any((ages[left] > ages[i]) & (claimed[left] >= claimed[i]))


@settings(max_examples=100, deadline=None)
@given(stream=streams())
def test_without_claims_the_oldest_tiles_run_first(stream):
    tiles = stream[0]
    for ages, _, chosen in run_stream(stream, no_claims):
        left = np.setdiff1d(np.arange(tiles), chosen)
        if len(left):
            assert ages[chosen].min() >= ages[left].max()


@settings(max_examples=100, deadline=None)
@given(stream=streams(max_age=10_000))
def test_far_from_the_age_bound_the_budget_goes_to_the_claimed_tiles_then_the_oldest(stream):
    tiles = stream[0]
    for ages, claimed, chosen in run_stream(stream, some_claims):
        left = np.setdiff1d(np.arange(tiles), chosen)
        if not len(left):
            continue
        if (claimed[chosen] == 0).any():  # an unclaimed tile runs only when every claimed one does
            assert (claimed[left] == 0).all()
        for i in chosen:  # nothing left out is as old and more claimed, or as claimed and older
            better = (ages[left] >= ages[i]) & (claimed[left] >= claimed[i])
            assert not np.any(better & ((ages[left] > ages[i]) | (claimed[left] > claimed[i])))


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
