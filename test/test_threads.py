"""CPU threads of our own processes (`threads`): torch's threads follow the host's load once a process asks for it
(the CLI's console script and the node do), one thread while the host is oversubscribed, its own count otherwise,
looked at most once a second; a library caller's process is left alone, and so is one that sets OMP_NUM_THREADS."""

from __future__ import annotations

import pytest
import torch

from tiled_detector.runtime import threads


@pytest.fixture
def following(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_following", {})
    before = torch.get_num_threads()
    load = [0.0]
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load[0], 0.0, 0.0))
    yield load
    torch.set_num_threads(before)


def test_torch_threads_follow_the_hosts_load_once_asked(following) -> None:
    own = torch.get_num_threads()
    assert threads.fit_to_load(clock=100.0) is None  # not asked: a library caller's threads are its own
    threads.follow_load()
    following[0] = own + threads.LOAD_MARGIN + 2  # oversubscribed
    assert threads.fit_to_load(clock=100.0) == 1 and torch.get_num_threads() == 1
    following[0] = 0.5  # quiet again, but looked at within the second: nothing changes yet
    assert threads.fit_to_load(clock=100.5) is None and torch.get_num_threads() == 1
    assert threads.fit_to_load(clock=101.2) == own and torch.get_num_threads() == own
    following[0] = own + threads.LOAD_MARGIN  # at the margin: not oversubscribed
    assert threads.fit_to_load(clock=103.0) == own


def test_a_process_that_sets_omp_num_threads_is_left_alone(following, monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    threads.follow_load()
    following[0] = 100.0
    assert threads.fit_to_load(clock=5.0) is None
