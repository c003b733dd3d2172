"""Rewards inside Ray tasks and actors (one Ray start for the module, shut down at the end)."""

from __future__ import annotations

import time

import pytest

from ulorl.reward.scorer import RewardScorer, score_batch
from ulorl.reward.verify import compute_reward

TOWER = (r"\boxed{10^{10^{10}}}", "5", False)
ITEMS = [(r"\boxed{\frac{1}{2}}", "0.5", False), (r"\boxed{33124147}", "33124147", False), ("no box", "1", False)]


@pytest.fixture(scope="module")
def ray_mod():
    import ray

    from ulorl.scale.local_ray import init_ray

    init_ray(num_cpus=1, log_to_driver=False)   # on 127.0.0.1 only
    try:
        yield ray
    finally:
        ray.shutdown()


def test_compute_reward_in_ray_task(ray_mod):
    task = ray_mod.remote(num_cpus=0)(compute_reward)
    refs = [task.remote(*it) for it in ITEMS]
    assert ray_mod.get(refs, timeout=120) == [1.0, 1.0, 0.0]


def test_scorer_in_ray_task_bounds_pathological_input(ray_mod):
    task = ray_mod.remote(num_cpus=0)(score_batch)
    t0 = time.monotonic()
    rewards, stats = ray_mod.get(task.remote(ITEMS + [TOWER], 1.0, 1), timeout=120)
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert stats["timeouts"] == 1
    assert time.monotonic() - t0 < 120


@pytest.mark.parametrize("concurrency", [1, 2])  # default actor and threaded actor
def test_scorer_as_ray_actor(ray_mod, concurrency):
    actor = ray_mod.remote(num_cpus=0, max_concurrency=concurrency)(RewardScorer).remote(timeout_s=1.0)
    try:
        refs = [actor.score.remote(ITEMS), actor.score.remote([TOWER])]
        assert ray_mod.get(refs, timeout=120) == [[1.0, 1.0, 0.0], [0.0]]
        stats = ray_mod.get(actor.get_stats.remote(), timeout=60)
        assert stats["timeouts"] == 1 and stats["items"] == 4
    finally:
        ray_mod.get(actor.close.remote(), timeout=60)
        ray_mod.kill(actor)
