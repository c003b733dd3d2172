"""Chunked log-probs through a DeepSpeed ZeRO-3 partitioned LM head == the full-logits path.

Real DeepSpeed ZeRO-3 on CPU (gloo), through the project's ``DeepSpeedBackend``: the same tiny Qwen3
(vocabulary 2,048 x hidden 64, so the embedding / head weight is above ZeRO-3's persistence
threshold and really lives in shards), each rank its own padded batch (prompt positions and
padding carry labels < 0), temperature 0.85. Per path: the loss sum(c * log p) + sum(c' * entropy)
(the entropy only where the path gives it a gradient), ``backend.backward``, then every parameter's
full reduced gradient (``deepspeed.utils.safe_get_full_grad``). Chunked (small chunks, so many
chunks per row) must equal full: log-probs, entropy, loss and every gradient, the LM head / tied
embedding one included, within 1e-5 relative (fp32).

This file runs itself under ``torch.distributed.run`` (``--nproc_per_node`` 1 or 2).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VOCAB, HIDDEN = 2048, 64
TEMPERATURE = 0.85
CHUNK_TOKENS = 3


def _tiny_model(tied: bool) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen3ForCausalLM(cfg).float()


def _batch(rank: int):
    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
    from ulorl.train.batch import build_train_batch

    g = torch.Generator().manual_seed(100 + rank)

    def s(i: int, n_prompt: int, n_resp: int) -> Sample:
        ids = torch.randint(1, VOCAB, (n_prompt + n_resp,), generator=g).tolist()
        out = Sample(sample_id=i, group_id=0, prompt_ids=ids[:n_prompt], response_ids=ids[n_prompt:],
                     sampling_logprobs=[0.0] * n_resp, status=SampleStatus.FINISHED, reward=1.0)
        out.segments = [SegmentSpan(0, n_resp, 0)]
        return out

    return build_train_batch([s(0, 4, 9), s(1, 2, 5 + rank)], pad_token_id=0)


def _script(argv: list[str]) -> None:
    import deepspeed
    from ulorl.config import config_from_dict
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.forward import output_head, token_stats

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tied", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    cfg = config_from_dict({"train": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}, "lr": 1e-4,
                                      "grad_clip": 1e9, "threads": 1}})
    model = _tiny_model(bool(a.tied))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    backend = DeepSpeedBackend(model, cfg.train)
    engine = backend.model
    head_w = output_head(engine).weight
    assert hasattr(head_w, "ds_id") and head_w.numel() == 0, "the head weight must be ZeRO-3 partitioned"
    params = dict(backend.module.named_parameters())
    batch = _batch(rank)
    batch2 = _batch(rank + 50)
    mask = batch.response_mask
    g = torch.Generator().manual_seed(7 + rank)
    c_lp = torch.randn(mask.shape, generator=g)
    c_ent = torch.randn(mask.shape, generator=g)
    c_lp2 = torch.randn(batch2.response_mask.shape, generator=g)
    dev = torch.device("cpu")
    result: dict[str, dict[str, torch.Tensor]] = {}
    for key, path, with_entropy in (("full", "full", False), ("chunked_lp", "chunked", False),
                                    ("chunked_ent", "chunked", True)):
        lp, ent = token_stats(engine, batch, TEMPERATURE, dev, path, chunk_tokens=CHUNK_TOKENS,
                              with_entropy=True if key == "full" else with_entropy)
        loss = (lp * c_lp * mask).sum()
        if key == "chunked_ent":
            loss = loss + (ent * c_ent * mask).sum()
        backend.backward(loss)
        # a second micro-batch accumulates onto the first (ZeRO-3 adds to its partitioned gradients)
        lp2, _ = token_stats(engine, batch2, TEMPERATURE, dev, path, chunk_tokens=CHUNK_TOKENS, with_entropy=False)
        backend.backward((lp2 * c_lp2 * batch2.response_mask).sum())
        grads = {n: deepspeed.utils.safe_get_full_grad(params[n]) for n in names}
        backend.zero_grad()
        result[key] = {"lp": lp.detach(), "ent": ent.detach(), "loss": loss.detach(),
                       **{f"grad/{n}": gr.clone() for n, gr in grads.items() if gr is not None}}
    # the entropy's own gradient: full path again, with the entropy made differentiable by hand
    from ulorl.algo.logprobs import logprobs_and_entropy
    from ulorl.train.forward import forward_logits

    logits = forward_logits(engine, batch, dev)
    lp_f, ent_f = logprobs_and_entropy(logits, batch.targets.long(), TEMPERATURE)
    if not ent_f.requires_grad:  # recompute the entropy differentiably from the logits
        logp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
        ent_f = -(logp.exp() * logp).sum(-1)
    loss = (lp_f * c_lp * mask).sum() + (ent_f * c_ent * mask).sum()
    backend.backward(loss)
    lp2, _ = token_stats(engine, batch2, TEMPERATURE, dev, "full", with_entropy=False)
    backend.backward((lp2 * c_lp2 * batch2.response_mask).sum())
    grads = {n: deepspeed.utils.safe_get_full_grad(params[n]) for n in names}
    backend.zero_grad()
    result["full_ent"] = {"loss": loss.detach(), **{f"grad/{n}": gr.clone() for n, gr in grads.items()
                                                   if gr is not None}}
    torch.save(result, a.out / f"rank{rank}.pt")
    torch.distributed.barrier()  # every rank runs the same steps here (no driver / worker split to close)


def run_ranks(out: Path, nproc: int, tied: bool, timeout: int = 300) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(Path(__file__).resolve()), "--out", str(out), "--tied", str(int(tied))]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    print(f"{nproc} rank(s), tied={tied}: {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


def _check_rank(res: dict[str, dict[str, torch.Tensor]]) -> None:
    tol = {"rtol": 1e-5, "atol": 1e-6}
    full = res["full"]
    grad_keys = [k for k in full if k.startswith("grad/")]
    assert any("embed_tokens" in k or "lm_head" in k for k in grad_keys)
    for key in ("chunked_lp", "chunked_ent"):
        torch.testing.assert_close(res[key]["lp"], full["lp"], **tol)
    torch.testing.assert_close(res["chunked_ent"]["ent"], full["ent"], **tol)
    torch.testing.assert_close(res["chunked_lp"]["loss"], full["loss"], **tol)
    torch.testing.assert_close(res["chunked_ent"]["loss"], res["full_ent"]["loss"], **tol)
    for ref_key, key in (("full", "chunked_lp"), ("full_ent", "chunked_ent")):
        ref, got = res[ref_key], res[key]
        assert sorted(k for k in got if k.startswith("grad/")) == sorted(grad_keys)
        for k in grad_keys:
            scale = float(ref[k].abs().max())
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5 * max(scale, 1e-3),
                                       msg=lambda m, k=k, key=key: f"{key} {k}: {m}")


def test_zero3_one_rank_tied_chunked_equals_full(tmp_path):
    for res in run_ranks(tmp_path, 1, tied=True):
        _check_rank(res)


@pytest.mark.slow
def test_zero3_one_rank_untied_chunked_equals_full(tmp_path):
    for res in run_ranks(tmp_path, 1, tied=False):
        _check_rank(res)


@pytest.mark.slow
def test_zero3_two_ranks_chunked_equals_full(tmp_path):
    results = run_ranks(tmp_path, 2, tied=True)
    for res in results:
        _check_rank(res)
    # both ranks see the same reduced (cross-rank summed) gradients
    for k in results[0]["full"]:
        if k.startswith("grad/"):
            torch.testing.assert_close(results[0]["chunked_lp"][k], results[1]["chunked_lp"][k])


if __name__ == "__main__":
    from ulorl.train.distributed import shutdown_process_group

    _script(sys.argv[1:])
    shutdown_process_group()
