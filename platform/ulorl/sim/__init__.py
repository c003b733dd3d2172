"""Rollout cost simulator (``ulorl-sim``): what segment count S buys for a length distribution and hardware.

    simulator   the pool model, length sources, cost model and its fit      ulorl.sim.simulator
    studies     the three questions: validate, paper, plan                 ulorl.sim.studies

Torch-free: it shares the segment-length rule, the context buckets and the prefix forest with the
rollout code it models (``ulorl.segments``, ``ulorl.rollout.buckets``, ``ulorl.rollout.prefix``).
"""
