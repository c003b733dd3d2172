"""``ulorl-bench zero3-memory --count-gathers``: ZeRO-3 collectives per training micro-step, per code tree.

    ulorl-bench zero3-memory --count-gathers                       # this checkout
    ulorl-bench zero3-memory --count-gathers --before ../base      # another checkout beside it

Per code tree (a checkout: its ``platform/`` goes first on ``PYTHONPATH``), ``--ranks`` gloo
processes under ``torch.distributed.run`` run this file as a script: a random Qwen3 with tied
embeddings (the LM head / embedding weight is the largest parameter: a "head-sized" gather, of
``>=`` its bytes, gathers it, as nothing else is that large), wrapped by that tree's
``DeepSpeedBackend`` at ZeRO-3, one row
per rank of ``--row-tokens`` tokens scored through that tree's ``train.forward.token_stats`` (the
chunked head, ``--chunk-tokens`` per chunk) and trained with its ``backend.backward`` — the calls
the trainer makes, present in both trees. DeepSpeed's own communication logger
(``deepspeed.comm.configure(prof_all=True)``) counts each collective and its message, separately
for the forward and the backward of each measured micro-step (after ``--warmup`` micro-steps,
which let ZeRO-3 record its parameter trace if its root hook runs), and for one no-grad pass.

``--release-after-use`` sets ``stage3_max_reuse_distance`` and ``stage3_prefetch_bucket_size`` to 0
(in both trees, by wrapping their ``deepspeed_config``): every parameter is then released after each
use and gathered again at the next, as on a model too large to keep them gathered (with
DeepSpeed's defaults this small model stays gathered once ZeRO-3's trace is complete). The counts
are then the gathers each pass needs. The LM head is tied to the input embedding, so one
head-sized gather per pass (two with the no-grad pass's) is the embedding's.

Bytes: an all-gather's output (the full parameters gathered, on each rank), a reduce-scatter's
input. ``trace_complete``: ZeRO-3's parameter coordinator holds a complete trace, the condition for
it to prefetch. ``loss`` and ``head_grad_norm`` (the reduced gradient of the LM head weight after
all micro-steps) show that both trees compute the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 2**20
PHASES = ("forward", "backward", "no_grad")


def _collectives(comms: dict[str, dict[int, list[Any]]], world: int, head_bytes: int) -> dict[str, Any]:
    """Counts and bytes per kind from DeepSpeed's ``comms_dict`` ({op: {msg_size: [count, ...]}})."""
    out: dict[str, Any] = {"all_gather": 0, "all_gather_bytes": 0, "head_gathers": 0,
                           "reduce_scatter": 0, "reduce_scatter_bytes": 0, "other": 0}
    for op, sizes in comms.items():
        for size, rec in sizes.items():
            n = int(rec[0])
            if "all_gather" in op:
                gathered = int(size) * world   # the logged message is this rank's input partition
                out["all_gather"] += n
                out["all_gather_bytes"] += n * gathered
                out["head_gathers"] += n if gathered >= head_bytes else 0
            elif "reduce_scatter" in op:
                out["reduce_scatter"] += n
                out["reduce_scatter_bytes"] += n * int(size)
            else:
                out["other"] += n
    return out


def rank_main(a: argparse.Namespace) -> None:
    """One rank (under ``torch.distributed.run``); rank 0 writes ``a.out``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import ulorl
    from ulorl.config import TrainConfig, config_from_dict
    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
    from ulorl.train.batch import build_train_batch
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.forward import autocast_ctx, token_stats

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=2 * a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=a.hidden // 4, tie_word_embeddings=True,
        max_position_embeddings=max(2048, a.row_tokens)))
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cfg = config_from_dict({"train": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}, "lr": 1e-4,
                                      "grad_clip": 1e9, "threads": 1, "bf16": a.bf16}})
    if a.release_after_use:
        import ulorl.train.deepspeed_backend as dsb

        tree_config = dsb.deepspeed_config

        def release_after_use(cfg: TrainConfig) -> dict[str, Any]:
            out = tree_config(cfg)
            out["zero_optimization"].update(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
            return out

        dsb.deepspeed_config = release_after_use   # looked up by DeepSpeedBackend at construction
    backend = DeepSpeedBackend(model, cfg.train, rollout_copy=False)
    engine = backend.model
    import deepspeed
    import deepspeed.comm as dscomm

    head = engine.module.get_output_embeddings().weight
    head_bytes = int(head.ds_numel) * head.element_size()
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, a.vocab, (a.row_tokens,), generator=g).tolist()
    n_prompt = 16
    sample = Sample(sample_id=rank, group_id=0, prompt_ids=ids[:n_prompt], response_ids=ids[n_prompt:],
                    sampling_logprobs=[-1.0] * (a.row_tokens - n_prompt), status=SampleStatus.FINISHED,
                    reward=1.0, segments=[SegmentSpan(0, a.row_tokens - n_prompt, 0)])
    batch = build_train_batch([sample], pad_token_id=0)
    mask = batch.response_mask
    cpu = torch.device("cpu")
    coordinator = engine.optimizer.parameter_offload.get_param_coordinator()

    def take() -> dict[str, Any]:
        got = _collectives(dscomm.comms_logger.comms_dict, world, head_bytes)
        dscomm.comms_logger.comms_dict = {}
        return got

    def micro_step(measure: bool) -> dict[str, Any]:
        engine.train()
        t0 = time.perf_counter()
        with autocast_ctx(a.bf16, cpu):
            lp, _ = token_stats(engine, batch, 1.0, cpu, "chunked", chunk_tokens=a.chunk_tokens, with_entropy=False)
        loss = -(lp * mask).sum() / mask.sum()
        fwd = take() if measure else {}
        backend.backward(loss)
        bwd = take() if measure else {}
        return {"forward": fwd, "backward": bwd, "loss": float(loss.detach()), "s": time.perf_counter() - t0}

    for _ in range(a.warmup):
        micro_step(False)
    dscomm.configure(enabled=True, prof_all=True, verbose=False)
    dscomm.comms_logger.comms_dict = {}
    steps = [micro_step(True) for _ in range(a.steps)]
    engine.eval()
    with torch.no_grad(), autocast_ctx(a.bf16, cpu):
        token_stats(engine, batch, 1.0, cpu, "chunked", chunk_tokens=a.chunk_tokens, with_entropy=False)
    no_grad = take()
    dscomm.configure(enabled=False)
    head_grad = deepspeed.utils.safe_get_full_grad(head)
    head_grad_norm = float(head_grad.float().norm()) if head_grad is not None else float("nan")
    torch.distributed.barrier()
    if rank == 0:
        chunks = -(-int(mask.sum()) // a.chunk_tokens)
        Path(a.out).write_text(json.dumps({
            "ulorl": str(Path(ulorl.__file__).resolve().parents[1]), "deepspeed": deepspeed.__version__,
            "world": world, "head_bytes": head_bytes, "chunks_per_row": chunks,
            "overlap_comm": bool(engine.zero_overlap_comm()), "release_after_use": bool(a.release_after_use),
            "trace_complete": bool(coordinator.is_complete_trace()),
            "steps": steps, "no_grad": no_grad, "head_grad_norm": head_grad_norm,
        }))


# ----------------------------------------------------------------------------- parent


def run_tree(tree: Path, out: Path, args: argparse.Namespace, timeout_s: float = 900) -> dict[str, Any]:
    """Run the ranks against the checkout ``tree`` (its ``platform/`` first on PYTHONPATH)."""
    platform = tree / "platform"
    if not (platform / "ulorl" / "train" / "deepspeed_backend.py").is_file():
        raise FileNotFoundError(f"--before {tree}: no ulorl checkout there (expected {platform}/ulorl/train/...)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(platform), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
           str(Path(__file__).resolve()), "--out", str(out), "--row-tokens", str(args.row_tokens),
           "--chunk-tokens", str(args.chunk_tokens), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--layers", str(args.layers),
           *(["--bf16"] if args.bf16 else []), *(["--gradient-checkpointing"] if args.gradient_checkpointing else []),
           *(["--release-after-use"] if args.release_after_use else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"gather count on {tree} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-4000:]}")
    return dict(json.loads(out.read_text()))


def per_step(result: dict[str, Any], phase: str, key: str) -> float:
    """Mean of ``key`` over the measured micro-steps (``phase`` forward / backward / both), or the no-grad pass."""
    if phase == "no_grad":
        return float(result["no_grad"][key])
    phases = ("forward", "backward") if phase == "both" else (phase,)
    steps = result["steps"]
    return sum(float(s[p][key]) for s in steps for p in phases) / len(steps)


def format_counts(results: dict[str, dict[str, Any]]) -> str:
    labels = list(results)
    first = results[labels[0]]
    rows = [f"ZeRO-3 collectives per micro-step (mean of {len(first['steps'])} after warm-up), {first['world']} gloo "
            f"ranks, one row per rank, {first['chunks_per_row']} head chunks per row, LM head "
            f"{first['head_bytes'] / MIB:.2f} MiB (tied), DeepSpeed {first['deepspeed']}"
            + (", parameters released after each use" if first["release_after_use"] else ""),
            f"{'':<34}" + "".join(f"{lab:>18}" for lab in labels)]

    def line(name: str, values: list[str]) -> None:
        rows.append(f"{name:<34}" + "".join(f"{v:>18}" for v in values))

    for phase in ("forward", "backward", "both", "no_grad"):
        title = {"both": "micro-step", "no_grad": "no-grad pass"}.get(phase, phase)
        line(f"{title}: all-gathers", [f"{per_step(r, phase, 'all_gather'):.1f}" for r in results.values()])
        line(f"{title}: MiB gathered", [f"{per_step(r, phase, 'all_gather_bytes') / MIB:.1f}"
                                        for r in results.values()])
        line(f"{title}: head-sized gathers", [f"{per_step(r, phase, 'head_gathers'):.1f}" for r in results.values()])
        if phase != "no_grad":
            line(f"{title}: reduce-scatters", [f"{per_step(r, phase, 'reduce_scatter'):.1f}"
                                              for r in results.values()])
            line(f"{title}: MiB reduce-scattered", [f"{per_step(r, phase, 'reduce_scatter_bytes') / MIB:.1f}"
                                                    for r in results.values()])
    line("overlap_comm", [str(r["overlap_comm"]) for r in results.values()])
    line("parameter trace complete", [str(r["trace_complete"]) for r in results.values()])
    line("loss (last micro-step)", [f"{r['steps'][-1]['loss']:.6f}" for r in results.values()])
    line("LM-head grad norm (accumulated)", [f"{r['head_grad_norm']:.6f}" for r in results.values()])
    line("micro-step s (noisy)", [f"{sum(s['s'] for s in r['steps']) / len(r['steps']):.2f}"
                                  for r in results.values()])
    rows.append("trees: " + "; ".join(f"{lab} = {r['ulorl']}" for lab, r in results.items()))
    return "\n".join(rows)


def run_gather_counts(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """{label: rank-0 result} for ``--before`` (if given) and this checkout, in that order."""
    here = Path(__file__).resolve().parents[3]
    trees: dict[str, Path] = {}
    if args.before:
        trees["before"] = Path(args.before).resolve()
    trees["after" if args.before else "this tree"] = here
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ulorl-gathers-") as tmp:
        for label, tree in trees.items():
            print(f"[ulorl-bench] gather count: {label} ({tree})", file=sys.stderr, flush=True)
            results[label] = run_tree(tree, Path(tmp) / f"{label.replace(' ', '_')}.json", args)
    return results


def add_arguments(ap: Any, rank: bool = False) -> None:
    """The bench options on ``ap`` (a parser or an argument group); ``rank``: also the rank-only ``--out``."""
    ap.add_argument("--row-tokens", type=int, default=1024, help="tokens of the one row each rank trains on")
    ap.add_argument("--chunk-tokens", type=int, default=64, help="LM-head chunk (train.logprob_chunk_tokens)")
    ap.add_argument("--steps", type=int, default=3, help="measured micro-steps")
    ap.add_argument("--warmup", type=int, default=2, help="micro-steps before measuring")
    ap.add_argument("--vocab", type=int, default=8192, help="vocabulary (LM head rows)")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers")
    ap.add_argument("--bf16", action="store_true", help="train.bf16 (DeepSpeed bf16 + autocast)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="recompute each layer in the backward")
    ap.add_argument("--release-after-use", action="store_true",
                    help="stage3_max_reuse_distance = stage3_prefetch_bucket_size = 0: the gathers each pass needs")
    if rank:
        ap.add_argument("--out", type=Path, required=True)


if __name__ == "__main__":
    # run as a script by path against another checkout: keep this folder off sys.path so that only
    # the PYTHONPATH tree's ulorl is importable
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    parser = argparse.ArgumentParser(description="one rank of ulorl-bench zero3-memory --count-gathers")
    add_arguments(parser, rank=True)
    rank_main(parser.parse_args())
    from ulorl.train.distributed import shutdown_process_group

    shutdown_process_group()
