"""ZeRO-3 load with one reader: ranks > 0 get the checkpoint as meta tensors from its safetensors headers
(transformers < 5.20 would read it whole, and fuse MoE experts, on every rank)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from ulorl.train.deepspeed_backend import checkpoint_meta_state_dict


def _ckpt(d, model_type="qwen3", shards=1):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": model_type}))
    tensors = {"model.embed_tokens.weight": torch.zeros(10, 4, dtype=torch.bfloat16),
               "model.norm.weight": torch.ones(4, dtype=torch.float32)}
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"))
    else:
        weight_map = {}
        for i, (k, v) in enumerate(tensors.items()):
            name = f"model-0000{i + 1}-of-00002.safetensors"
            save_file({k: v}, str(d / name))
            weight_map[k] = name
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


@pytest.mark.parametrize("shards", [1, 2])
def test_meta_state_dict_has_the_checkpoints_names_shapes_dtypes_and_no_data(tmp_path, shards):
    meta = checkpoint_meta_state_dict(_ckpt(tmp_path / "m", shards=shards))
    assert meta is not None and set(meta) == {"model.embed_tokens.weight", "model.norm.weight"}
    emb = meta["model.embed_tokens.weight"]
    assert emb.shape == (10, 4) and emb.dtype == torch.bfloat16
    assert meta["model.norm.weight"].dtype == torch.float32
    assert all(t.device.type == "meta" for t in meta.values())


def test_every_rank_reads_where_meta_tensors_cannot_stand_in(tmp_path):
    assert checkpoint_meta_state_dict(_ckpt(tmp_path / "other", model_type="bert")) is None   # may hold buffers
    d = _ckpt(tmp_path / "partial", shards=2)
    next(d.glob("model-00002-*.safetensors")).unlink()     # a download in progress
    assert checkpoint_meta_state_dict(d) is None
    assert checkpoint_meta_state_dict("nobody/not-in-the-cache-xyz") is None
    assert checkpoint_meta_state_dict(tmp_path / "missing") is None
