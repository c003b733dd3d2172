"""Shared builders of the multi-process training tests (DeepSpeed backend, sequence parallelism):
a random-weight embedded model on disk, the experiment config, released groups of samples."""

from __future__ import annotations

from pathlib import Path

import torch


def build_random_model(out: Path) -> Path:
    """The embedded architecture with random weights (seeded), saved with its tokenizer."""
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def experiment(model_dir: Path, **train: object):
    """A POIS / DMMPT experiment on ``model_dir`` with the DeepSpeed ZeRO-2 backend; ``train`` overrides."""
    from ulorl.config import config_from_dict

    t = {"lr": 1e-4, "grad_clip": 1.0, "micro_batch_tokens": 96, "updates_per_step": 2, "threads": 1,
         "backend": "deepspeed", "deepspeed": {"zero_stage": 2}}
    t.update(train)
    return config_from_dict({
        "model": {"name_or_path": str(model_dir)},
        "rollout": {"temperature": 0.85},
        "algo": {"is_mode": "pois", "mpt": {"mode": "dynamic", "tau": 0.99, "sigma": 0.2}},
        "train": t,
    })


def released_groups(vocab: int, seed: int = 0, groups: int = 5, group_size: int = 4, base_len: int = 30,
                    len_step: int = 10) -> list:
    """Released groups with mixed rewards and uneven lengths: group g's responses have 2 ..
    base_len + len_step * g tokens (so ranks get uneven micro-batch counts)."""
    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan

    g = torch.Generator().manual_seed(seed)
    out = []
    for gid in range(groups):
        prompt = torch.randint(3, vocab, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        rewards = [1.0, 0.0] + [float(torch.randint(0, 2, (1,), generator=g)) for _ in range(group_size - 2)]
        for k in range(group_size):
            t = int(torch.randint(2, base_len + len_step * gid, (1,), generator=g))
            resp = torch.randint(3, vocab, (t,), generator=g).tolist()
            out.append(Sample(
                sample_id=gid * group_size + k, group_id=gid, prompt_ids=prompt, response_ids=resp,
                sampling_logprobs=[-1.0] * t, segments=[SegmentSpan(0, t, 0)],
                status=SampleStatus.FINISHED, reward=rewards[k],
            ))
    return out
