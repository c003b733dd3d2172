"""What measuring (and correcting) the train / inference mismatch costs an update.

    python -m ulorl.bench.mismatch_cost [--model embedded:choice] [--rows 64] [--response-len 192] \\
        [--segments 4] [--reps 7] [--threads 1] [--json]

Builds ``--rows`` released samples of ``--response-len`` response tokens in ``--segments`` segments (random
tokens, engine log-probs and SAIS log-probs; the newest segment at the current version) and times, in one
process, interleaved rep by rep so machine load hits every variant alike:

- ``prepare_update`` (filter, batch, advantages, the no-grad pass, old log-probs, mask, statistics) with
  ``algo.rollout_correction.measure`` false (the update without the mismatch block) and true, with and
  without a correction (token_tis, seq_mis);
- the mismatch block alone (``token_sources`` + ``rollout_mismatch``) beside the no-grad pass it follows.

Prints medians (seconds) and the ratio to the unmeasured update; ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from ulorl.config import load_experiment
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.backend import TorchBackend
from ulorl.train.batch import build_train_batch
from ulorl.train.mismatch import MismatchSettings, rollout_mismatch, token_sources
from ulorl.train.update import UpdateContext, parallel_ops, prepare_update
from ulorl.train.worker import load_model


def synthetic_samples(rows: int, response_len: int, segments: int, vocab: int, version: int,
                      seed: int = 0) -> list[Sample]:
    """``rows`` finished samples (groups of 8, rewards alternating) with engine and SAIS log-probs."""
    g = torch.Generator().manual_seed(seed)
    seg_len = max(1, response_len // segments)
    out = []
    for i in range(rows):
        resp = torch.randint(3, vocab, (response_len,), generator=g).tolist()
        spans = [SegmentSpan(k * seg_len, response_len if k == segments - 1 else (k + 1) * seg_len,
                             version - (segments - 1 - k)) for k in range(segments)]
        lps = (-torch.rand(response_len, generator=g) * 3).tolist()
        out.append(Sample(i, i // 8, torch.randint(3, vocab, (24,), generator=g).tolist(), response_ids=resp,
                          sampling_logprobs=lps, old_logprobs=[x - 0.01 for x in lps], segments=spans,
                          status=SampleStatus.FINISHED, reward=float(i % 2)))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    cfg = load_experiment(args.experiment, [f"model.name_or_path={args.model}", "algo.dynamic_sampling=false"])
    model, _ = load_model(cfg, "cpu")
    vocab = int(model.get_output_embeddings().weight.shape[0])
    version = args.segments - 1
    samples = synthetic_samples(args.rows, args.response_len, args.segments, vocab, version)
    backend = TorchBackend(model, cfg.train)
    variants = {
        "update, not measured": {"measure": False, "mode": "off"},
        "update, measured": {"measure": True, "mode": "off"},
        "update, measured + token_tis": {"measure": True, "mode": "token_tis"},
        "update, measured + seq_mis": {"measure": True, "mode": "seq_mis"},
    }
    ctxs = {}
    for name, rc in variants.items():
        algo = cfg.algo.model_copy(update={"rollout_correction": cfg.algo.rollout_correction.model_copy(update=rc)})
        ctxs[name] = UpdateContext(backend, algo, cfg.train, cfg.rollout.temperature, 0, torch.device("cpu"),
                                   args.response_len, True)
    times: dict[str, list[float]] = {k: [] for k in [*variants, "no-grad pass", "mismatch block"]}
    batch = build_train_batch(samples, 0)
    dp = parallel_ops(backend, cfg.train)
    for _ in range(args.reps):
        for name, ctx in ctxs.items():
            t0 = time.perf_counter()
            prepare_update(samples, ctx, version)
            times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cur, _ = dp.token_stats(model, batch, cfg.rollout.temperature, cfg.train.micro_batch_tokens,
                                torch.device("cpu"), False)
        times["no-grad pass"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rollout_mismatch(token_sources(samples, batch), batch, cur, cur * batch.response_mask, MismatchSettings(
            cfg.algo.rollout_correction.model_copy(update={"mode": "token_tis"}), "pois", True, version,
            args.response_len))
        times["mismatch block"].append(time.perf_counter() - t0)
    base = statistics.median(times["update, not measured"])
    return {"rows": args.rows, "response_len": args.response_len, "segments": args.segments, "reps": args.reps,
            "threads": args.threads, "model": args.model,
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            "ratio_to_unmeasured_update": {k: statistics.median(v) / base for k, v in times.items()}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ulorl.bench.mismatch_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="experiments/quickstart_choice.yaml")
    p.add_argument("--model", default="embedded:choice")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--response-len", type=int, default=192)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['rows']} rows x {out['response_len']} response tokens, {out['segments']} segments, "
          f"{out['reps']} reps, {out['threads']} thread(s), model {out['model']}")
    for k, v in out["median_s"].items():
        print(f"  {k:32s} {v * 1e3:9.2f} ms   x{out['ratio_to_unmeasured_update'][k]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
