"""Settings a run would accept and then not act on are refused when the config loads, naming the key and
the fix (exit 2 from ulorl-train, nothing created): a weight-sync transport with an engine that transfers
no buckets, an entropy probe interval past the run's last step, more periodic-eval problems than the
embedded held-out split holds (it used to score fewer while the run recorded the number asked for)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.cli import train as train_cli
from ulorl.config import ConfigError, load_experiment

QUICK = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"


@pytest.mark.parametrize("overrides, message", [
    (["rollout.weight_sync_transport=shm"],
     "rollout.weight_sync_transport=shm only applies to rollout.engine=vllm with rollout.weight_transfer=stream (how "
     "a weight bucket reaches vLLM's workers), and here the hf engine decodes with the trainer's own weights, so "
     "nothing is transferred; leave it at auto, or set rollout.engine=vllm"),
    (["rollout.engine=vllm", "rollout.weight_transfer=nccl", "rollout.weight_sync_transport=inline"],
     "rollout.weight_sync_transport=inline only applies to rollout.engine=vllm with rollout.weight_transfer=stream "
     "(how a weight bucket reaches vLLM's workers), and here rollout.weight_transfer=nccl moves the weights with "
     "vLLM's native transfer, not in buckets; leave it at auto, or set rollout.weight_transfer=stream"),
    (["train.max_steps=30", "train.entropy_probe_every=1000000"],
     "train.entropy_probe_every (1000000) is above train.max_steps (30), so the probe would never run; set it to at "
     "most 30 (every N steps), or 0 for off"),
    (["data.task.num_heldout=10", "eval.num_problems=64"],
     "eval.num_problems (64) is more than the embedded held-out split holds (data.task.num_heldout 10): the periodic "
     "eval would score 10 problems while the run records 64; raise data.task.num_heldout to 64 or more (the held-out "
     "split is a prefix of one stream: its first problems stay the same), or lower eval.num_problems to 10 (or null: "
     "all)"),
])
def test_a_setting_the_run_would_ignore_is_refused_at_load(tmp_path, capsys, monkeypatch, overrides, message):
    with pytest.raises(ConfigError) as err:
        load_experiment(QUICK, overrides)
    assert message in str(err.value)
    monkeypatch.chdir(tmp_path)
    assert train_cli.main([str(QUICK), *overrides, "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []                       # no store, no run folder


@pytest.mark.parametrize("overrides", [
    ["rollout.engine=vllm", "rollout.weight_sync_transport=shm"],      # what the setting is for
    ["train.max_steps=30", "train.entropy_probe_every=30"],            # probes the last step
    ["data.task.num_heldout=64", "eval.num_problems=64"],
    ["data.task.num_heldout=10", "eval.num_problems=64", "eval.every=0"],    # no periodic eval: nothing scored short
    ["data.task.num_heldout=10", "eval.num_problems=null"],            # all of them
])
def test_the_settings_in_their_range_still_load(overrides):
    load_experiment(QUICK, overrides)
