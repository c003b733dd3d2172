"""ZeRO-3's live / reuse / prefetch limits reach DeepSpeed's config from train.deepspeed.*."""

from __future__ import annotations

from ulorl.config import config_from_dict
from ulorl.train.deepspeed_backend import deepspeed_config


def test_zero3_limits_are_deepspeeds_defaults_unless_set():
    zero = deepspeed_config(config_from_dict({"train": {"deepspeed": {"zero_stage": 3}}}).train)["zero_optimization"]
    assert (zero["stage3_max_live_parameters"], zero["stage3_max_reuse_distance"],
            zero["stage3_prefetch_bucket_size"]) == (1_000_000_000, 1_000_000_000, 50_000_000)
    cfg = config_from_dict({"train": {"deepspeed": {"zero_stage": 3, "max_live_parameters": 400_000,
                                                    "max_reuse_distance": 0, "prefetch_bucket_size": 200_000}}})
    zero = deepspeed_config(cfg.train)["zero_optimization"]
    assert (zero["stage3_max_live_parameters"], zero["stage3_max_reuse_distance"],
            zero["stage3_prefetch_bucket_size"]) == (400_000, 0, 200_000)


def test_stage_2_carries_no_stage_3_keys():
    zero = deepspeed_config(config_from_dict({"train": {"deepspeed": {"zero_stage": 2}}}).train)["zero_optimization"]
    assert not [k for k in zero if k.startswith("stage3_")]
