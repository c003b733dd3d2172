"""``ulorl-bench memory``: peak memory and time of one training micro-step on one long row.

One micro-step = forward, token log-probs, entropy, clipped token-level loss, backward, through
the trainer's own ``ulorl.train.forward.token_stats``. Paths: ``chunked`` (hidden states through
the LM head in chunks, the default) and ``full`` (the model's ``[T, V]`` logits, the path before
chunking). Peak = process max RSS on CPU, ``torch.cuda.max_memory_allocated`` on GPU.

    ulorl-bench memory --seq-lens 8192,32768 --vocab 151936 --hidden 128 --layers 4 --json
    ulorl-bench memory --seq-lens 4096 --model /models/Qwen3-4B --device cuda   # config only, random weights

The command runs every (length, path) in a fresh subprocess (``python -m ulorl.bench.memory
--one ...``) so peaks never mix, and refuses the full path where its predicted peak exceeds the
machine's available memory instead of running into the out-of-memory killer. In-process callers
(a GPU validation script) use ``measure_micro_step``.

On CPU the subprocesses run with glibc's ``MALLOC_MMAP_THRESHOLD_`` at ``--malloc-mmap-threshold-kb``
(64 KiB; 0 keeps glibc's default). glibc raises its mmap threshold after every large free, so by
default freed tensors stay in the heap and the peak RSS is the heap's high-water mark, which moved by
~100 MB at 32k tokens between runs of commits with the same micro-step code (platform/ulorl/docs/long_rows.md);
pinned, a freed tensor goes back to the system at once and the peak shows what is live, within 1 MB
from run to run there (as ``torch.cuda.max_memory_allocated`` does on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from ulorl.algo.loss import policy_loss
from ulorl.config import config_from_dict
from ulorl.jsonout import emit_json
from ulorl.train.batch import TrainBatch
from ulorl.train.distributed import ensure_process_group, shutdown_process_group
from ulorl.train.forward import LOGPROB_PATHS, token_stats

MIB = 1024**2
PROMPT_TOKENS = 64
DEFAULT_MMAP_THRESHOLD_KB = 64
#: bytes per token of the full path beyond activations, per vocabulary entry: float32 logits, their
#: [:, :-1] copy and the gradients of both (measured ~1.8 MB / token at V = 151,936: ~12 V).
FULL_PATH_BYTES_PER_TOKEN_PER_VOCAB = 12
#: activation bytes per token per (hidden x layer) without checkpointing (tiny Qwen3 shape: ~40 KB / token)
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN_LAYER = 80


def build_model(vocab: int, hidden: int, layers: int, model: str | None, seq_len: int,
                attn_implementation: str = "sdpa") -> torch.nn.Module:
    """Random-weight causal LM: from ``model``'s config (local folder or cached id, no download), else a
    Qwen3 of the given shape (head_dim 32, intermediate 4 x hidden, kv heads = heads / 2)."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    if model:
        cfg = AutoConfig.from_pretrained(model, local_files_only=True)
    else:
        heads = max(1, hidden // 32)
        cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                          num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
                          max_position_embeddings=max(seq_len + 1, 4096), tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)


def one_row_batch(seq_len: int, vocab: int) -> TrainBatch:
    """One unpadded row of ``seq_len`` random tokens, the last ``seq_len - 64`` (at least 1) a response."""
    g = torch.Generator().manual_seed(seq_len)
    ids = torch.randint(0, vocab, (1, seq_len), generator=g)
    prompt = min(PROMPT_TOKENS, seq_len - 1)
    resp = torch.zeros(1, seq_len - 1, dtype=torch.bool)
    resp[0, prompt - 1:] = True
    return TrainBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), targets=ids[:, 1:], response_mask=resp,
        sais_logprobs=torch.zeros(1, seq_len - 1), token_versions=torch.zeros(1, seq_len - 1, dtype=torch.long),
        rewards=torch.ones(1), group_ids=torch.zeros(1, dtype=torch.long),
        prompt_lens=[prompt], response_lens=[seq_len - prompt],
    )


def max_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def micro_step(model: torch.nn.Module, batch: TrainBatch, path: str, device: torch.device,
               temperature: float = 0.85, backward: Callable[[torch.Tensor], None] | None = None) -> float:
    """Forward, log-probs + entropy, loss, backward (``backward(loss)``, default ``loss.backward()``).
    Returns the loss."""
    lp, ent = token_stats(model, batch, temperature, device, path)
    mask = batch.response_mask.to(device)
    loss, _ = policy_loss(lp, lp.detach() - 0.01, torch.ones(1, device=device), mask,
                          num_tokens=batch.num_response_tokens)
    if backward is not None:
        backward(loss)
    else:
        loss.backward()
    _ = float((ent.detach() * mask).sum())  # entropy is part of the step (it gates the DMMPT mask)
    return float(loss.detach())


def measure_micro_step(
    seq_len: int,
    path: str,
    *,
    vocab: int,
    hidden: int,
    layers: int,
    model: str | None,
    device: str,
    gradient_checkpointing: bool = True,
    repeats: int = 1,
    attn_implementation: str = "sdpa",
    zero_stage: int = 0,
) -> dict[str, Any]:
    """Build the model, run ``repeats`` micro-steps on one row of ``seq_len`` tokens, report peak and time.

    ``zero_stage`` 1-3: the model runs inside a one-process DeepSpeed engine of that ZeRO stage (the
    trainer's DeepSpeed config, AdamW), backward through the engine; 0: plain torch.

    Returns ``{seq_len, path, peak_rss_mb, seconds, device, base_rss_mb, peak_gpu_mb,
    gradient_checkpointing, loss}``: ``seconds`` = median micro-step time; ``peak_rss_mb`` = this
    process's max RSS (meaningful per length and path only in a fresh process); ``peak_gpu_mb`` =
    ``torch.cuda.max_memory_allocated`` during the steps (None on CPU); ``base_rss_mb`` = max RSS
    after building the model, before the first step.
    """
    if path not in LOGPROB_PATHS:
        raise ValueError(f"path must be one of {LOGPROB_PATHS}, got {path!r}")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    dev = torch.device(device)
    net = build_model(vocab, hidden, layers, model, seq_len, attn_implementation).to(dev)
    if gradient_checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
    net.train()
    vocab_size = int(cast(Any, net).config.vocab_size)
    step_model: torch.nn.Module = net
    backward: Callable[[torch.Tensor], None] | None = None

    def zero_grad() -> None:
        net.zero_grad(set_to_none=True)

    if zero_stage:
        step_model, backward, zero_grad = deepspeed_engine(net, zero_stage, dev)
    batch = one_row_batch(seq_len, vocab_size)
    base = max_rss_mb()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    times: list[float] = []
    loss = float("nan")
    for _ in range(max(1, repeats)):
        zero_grad()
        t0 = time.perf_counter()
        loss = micro_step(step_model, batch, path, dev, backward=backward)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "seq_len": seq_len,
        "path": path,
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),   # glibc's, as this process ran
        "peak_rss_mb": round(max_rss_mb(), 1),
        "seconds": round(times[len(times) // 2], 3),
        "device": str(dev),
        "base_rss_mb": round(base, 1),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated(dev) / MIB, 1) if dev.type == "cuda" else None,
        "gradient_checkpointing": gradient_checkpointing,
        "zero_stage": zero_stage,
        "loss": loss,
    }


def deepspeed_engine(
    net: torch.nn.Module, zero_stage: int, device: torch.device,
) -> tuple[torch.nn.Module, Callable[[torch.Tensor], None], Callable[[], None]]:
    """``net`` in a one-process DeepSpeed engine (the trainer's config at ``zero_stage``, AdamW):
    (engine, backward(loss), zero_grad())."""
    from ulorl.train.deepspeed_backend import deepspeed_config

    if zero_stage not in (1, 2, 3):
        raise ValueError(f"--zero-stage must be 0 (no DeepSpeed) or 1, 2, 3, got {zero_stage}")
    ensure_process_group(device.type)
    import deepspeed  # optional dependency: only for --zero-stage

    train = config_from_dict({"train": {"backend": "deepspeed", "deepspeed": {"zero_stage": zero_stage}}}).train
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-6)
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=deepspeed_config(train))

    def backward(loss: torch.Tensor) -> None:
        engine.backward(loss, scale_wrt_gas=False)

    def zero_grad() -> None:
        engine.optimizer.zero_grad(set_to_none=True)

    return engine, backward, zero_grad


def predicted_full_peak_mb(seq_len: int, vocab: int, hidden: int, layers: int) -> float:
    """Rough CPU peak of the full path: logits buffers + activations + weights (fp32 + grads + 2 GiB slack)."""
    per_token = (FULL_PATH_BYTES_PER_TOKEN_PER_VOCAB * vocab
                 + ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN_LAYER * hidden * layers)
    weights = 8 * 2 * vocab * hidden
    return (seq_len * per_token + weights) / MIB + 512


def available_memory_mb() -> float:
    """MemAvailable from /proc/meminfo (Linux); inf where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def _one_args(args: argparse.Namespace, seq_len: int, path: str) -> list[str]:
    out = [sys.executable, "-m", "ulorl.bench.memory", "--one", "--seq-len", str(seq_len), "--path", path,
           "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--device", args.device, "--repeats", str(args.repeats), "--threads", str(args.threads),
           "--attn-implementation", args.attn_implementation, "--zero-stage", str(args.zero_stage)]
    if args.model:
        out += ["--model", args.model]
    if not args.gradient_checkpointing:
        out.append("--no-gradient-checkpointing")
    return out


def one_env(mmap_threshold_kb: int) -> dict[str, str]:
    """The measurement subprocess's environment: glibc's mmap threshold pinned at ``mmap_threshold_kb``
    (module docstring), or left to glibc with 0."""
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mmap_threshold_kb > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold_kb * 1024)
    return env


def run_one_subprocess(args: argparse.Namespace, seq_len: int, path: str) -> dict[str, Any]:
    proc = subprocess.run(_one_args(args, seq_len, path), check=False, capture_output=True, text=True,
                          env=one_env(getattr(args, "malloc_mmap_threshold_kb", DEFAULT_MMAP_THRESHOLD_KB)))
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"seq_len": seq_len, "path": path, "peak_rss_mb": None, "seconds": None,
                "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(args: argparse.Namespace, progress: Any = None) -> dict[str, Any]:
    """Every (length, path) in a fresh subprocess; the full path refused where it cannot fit."""
    results: list[dict[str, Any]] = []
    for seq_len in args.seq_lens:
        for path in args.paths:
            if path == "full" and args.device == "cpu" and not args.model:
                need = predicted_full_peak_mb(seq_len, args.vocab, args.hidden, args.layers)
                avail = min(available_memory_mb(), args.memory_limit_mb or float("inf"))
                if need > avail:
                    results.append({"seq_len": seq_len, "path": path, "peak_rss_mb": None, "seconds": None,
                                    "refused": f"predicted peak {need:.0f} MB > available {avail:.0f} MB",
                                    "predicted_peak_mb": round(need)})
                    if progress:
                        progress(f"T={seq_len} {path}: refused ({results[-1]['refused']})")
                    continue
            if progress:
                progress(f"T={seq_len} {path}: running")
            r = run_one_subprocess(args, seq_len, path)
            results.append(r)
            if progress:
                progress(f"T={seq_len} {path}: {r.get('peak_rss_mb')} MB, {r.get('seconds')} s")
    out: dict[str, Any] = {
        "model": args.model or {"vocab": args.vocab, "hidden": args.hidden, "layers": args.layers},
        "device": args.device, "gradient_checkpointing": args.gradient_checkpointing, "threads": args.threads,
        "zero_stage": args.zero_stage,
        "malloc_mmap_threshold_kb": getattr(args, "malloc_mmap_threshold_kb", DEFAULT_MMAP_THRESHOLD_KB),
        "results": results,
    }
    out["summary"] = summarize(results)
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path: KB per token between the shortest and longest measured length; time ratio chunked / full."""
    summ: dict[str, Any] = {}
    for path in LOGPROB_PATHS:
        ok = sorted((r for r in results if r["path"] == path and r.get("peak_rss_mb")), key=lambda r: r["seq_len"])
        if len(ok) >= 2 and ok[-1]["seq_len"] > ok[0]["seq_len"]:
            slope = (ok[-1]["peak_rss_mb"] - ok[0]["peak_rss_mb"]) * 1024 / (ok[-1]["seq_len"] - ok[0]["seq_len"])
            summ[f"{path}_kb_per_token"] = round(slope, 2)
    by = {(r["seq_len"], r["path"]): r for r in results if r.get("seconds")}
    ratios = {str(t): round(by[(t, "chunked")]["seconds"] / by[(t, "full")]["seconds"], 3)
              for (t, p) in by if p == "full" and (t, "chunked") in by}
    if ratios:
        summ["time_ratio_chunked_over_full"] = ratios
    return summ


def format_report(out: dict[str, Any]) -> str:
    lines = [f"{'seq_len':>8} {'path':>8} {'peak_rss_mb':>12} {'seconds':>9}  note"]
    for r in out["results"]:
        note = r.get("refused") or r.get("error") or ""
        peak = f"{r['peak_rss_mb']:.1f}" if r.get("peak_rss_mb") else "-"
        sec = f"{r['seconds']:.3f}" if r.get("seconds") else "-"
        lines.append(f"{r['seq_len']:>8} {r['path']:>8} {peak:>12} {sec:>9}  {note}")
    for k, v in out["summary"].items():
        lines.append(f"{k}: {v}")
    return "\n".join(lines)


def _seq_lens(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seq-lens: expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 2:
        raise argparse.ArgumentTypeError(f"--seq-lens: need integers >= 2, got {text!r}")
    return vals


def _paths(text: str) -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in LOGPROB_PATHS]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"--paths: choose from {','.join(LOGPROB_PATHS)}, got {text!r}")
    return vals


def add_memory_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``memory`` on an ``add_subparsers`` object (``ulorl.cli.bench``)."""
    p = sub.add_parser("memory", help="peak memory and time of one training micro-step on one long row",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_shape_args(p)
    p.add_argument("--seq-lens", type=_seq_lens, default=[8192, 32768], help="row lengths (tokens), comma-separated")
    p.add_argument("--paths", type=_paths, default=list(LOGPROB_PATHS), help="log-prob paths: chunked,full")
    p.add_argument("--json", action="store_true", help="print one JSON object (with a 'results' list) on stdout")
    p.add_argument("--memory-limit-mb", type=float, default=None,
                   help="refuse the full path above this predicted peak (default: the machine's available memory)")
    p.add_argument("--malloc-mmap-threshold-kb", type=int, default=DEFAULT_MMAP_THRESHOLD_KB,
                   help="glibc MALLOC_MMAP_THRESHOLD_ of the measurements: freed tensors leave the heap at once, "
                        "peaks show live memory (0 = glibc's default, peaks include what the heap kept)")
    return p


def add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen3: 151936)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size")
    p.add_argument("--layers", type=int, default=4, help="decoder layers")
    p.add_argument("--model", default=None, help="local model folder or cached HF id: its config, random weights")
    p.add_argument("--device", default="cpu", help="cpu | cuda (| cuda:N)")
    p.add_argument("--repeats", type=int, default=1, help="micro-steps per measurement (median time)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager", "flash_attention_2"])
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3],
                   help="run each micro-step in a one-process DeepSpeed engine of this ZeRO stage (0 = plain torch)")
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                   help="run both paths without activation checkpointing (default: checkpointing on)")


def memory_main(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(f"[ulorl-bench memory] {msg}", file=sys.stderr, flush=True)

    out = run_bench(args, progress=log)
    if args.json:
        emit_json(out)
    else:
        print(format_report(out))
    return 0 if not any(r.get("error") for r in out["results"]) else 1


def _one_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ulorl.bench.memory",
                                description="one measurement (the subprocess of ulorl-bench memory)")
    p.add_argument("--one", action="store_true", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--path", choices=list(LOGPROB_PATHS), required=True)
    add_shape_args(p)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    r = measure_micro_step(a.seq_len, a.path, vocab=a.vocab, hidden=a.hidden, layers=a.layers, model=a.model,
                           device=a.device, gradient_checkpointing=a.gradient_checkpointing, repeats=a.repeats,
                           attn_implementation=a.attn_implementation, zero_stage=a.zero_stage)
    print(json.dumps(r))
    shutdown_process_group()   # --zero-stage: the one-rank group DeepSpeed needed
    return 0


if __name__ == "__main__":
    sys.exit(_one_main())
