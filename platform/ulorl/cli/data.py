"""``ulorl-data``: the embedded synthetic task and the warm-started tiny model.

    ulorl-data warmstart                          # build (or reuse) the cached warm start
    ulorl-data warmstart --out platform/ulorl/assets/embedded   # build/reuse, copy to the shipped folder
    ulorl-data warmstart --force                  # rebuild even if a cached build exists
    ulorl-data stats                              # length distribution + accuracy by length (table)
    ulorl-data stats --json --n 256 --seed 0      # the same as one JSON object on stdout
    ulorl-data sample --n 3                       # print a few task items with their solutions
    ulorl-data warmstart --profile choice --out platform/ulorl/assets/embedded_choice   # the second profile
    ulorl-data warmstart --profile choice --hidden-size 256 --out runs/shapes/wide   # another model shape
    ulorl-data warmstart --moe-experts 4 --out platform/ulorl/assets/embedded_moe   # the tiny Qwen3-MoE
    ulorl-data stats --profile choice --json      # its stats (sampling_entropy, accuracy_by_length)

Profiles (--profile): default = embedded (running sums, one solution, the fast default);
choice = embedded:choice (distinct two-digit terms, free operand order, spacing and line separators,
or a short guess; max response length 192).

Subcommands:
  warmstart  short supervised pass on the task until held-out accuracy (temperature 0.85) reaches
             the target; cached under $ULORL_CACHE_DIR/warmstart/<config hash> (default
             ~/.cache/ulorl); --out copies the result (weights, config, tokenizer) to a folder.
  stats      token lengths of reference solutions (p50/p90/p99/max/mean) over N held-out items,
             the entropy per token of the warm-start targets (target_entropy), and the model's
             held-out accuracy at rollout sampling settings (temperature 0.85, top_p 1.0, no
             top_k, the profile's max response length) by reference-length bucket, with its mean
             sampling entropy per response token (sampling_entropy, nats).
  sample     show generated task items (prompt, reference solution, answer).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ulorl.data.profiles import profile_names
from ulorl.jsonout import emit_json, json_command
from ulorl.models.tiny import DEFAULT_TINY, MoeSpec, TinySpec
from ulorl.models.tokenizer import DEFAULT_VOCAB_SIZE, VOCAB_RANGE


class DataCliError(Exception):
    """A user-facing error (bad flag value, missing model folder)."""


def _log(msg: str) -> None:
    print(f"[ulorl-data] {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ulorl-data", description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="{warmstart,stats,sample}")

    w = sub.add_parser("warmstart", help="build (or reuse) the warm-started embedded model",
                       description="Supervised warm start of the embedded tiny Qwen3 on the synthetic task; "
                                   "stops when held-out accuracy reaches --target-acc.")
    w.add_argument("--profile", choices=profile_names(), default="default",
                   help="embedded profile to build (default: default; 'choice' is embedded:choice)")
    w.add_argument("--out", default=None,
                   help="also copy the result to this folder (e.g. platform/ulorl/assets/embedded)")
    w.add_argument("--force", action="store_true", help="rebuild even if a cached build with this config exists")
    w.add_argument("--seed", type=int, default=None, help="training seed (default 0)")
    w.add_argument("--target-acc", type=float, default=None,
                   help="stop at this held-out accuracy (default 0.35; choice 0.4 and >= 0.25 in every length bucket)")
    w.add_argument("--max-steps", type=int, default=None, help="optimizer-step guard (default 3000; choice 6000)")
    w.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (default 50; choice 100)")
    w.add_argument("--threads", type=int, default=None, help="torch threads (default min(2, cores))")
    w.add_argument("--hidden-size", type=int, default=None,
                   help=f"model width (default {DEFAULT_TINY.hidden_size}); must divide by the heads")
    w.add_argument("--intermediate-size", type=int, default=None,
                   help=f"MLP width (default {DEFAULT_TINY.intermediate_size}; with --hidden-size alone: 4x it)")
    w.add_argument("--layers", type=int, default=None,
                   help=f"transformer layers (default {DEFAULT_TINY.num_hidden_layers})")
    w.add_argument("--vocab-size", type=int, default=None,
                   help=f"tokenizer size asked for: 256 bytes + 2 special tokens + merges, <= 512 (default "
                        f"{DEFAULT_VOCAB_SIZE}); the task's corpus has merges for 264 at most, so a larger value "
                        "gives the same 264 tokens")
    w.add_argument("--moe-experts", type=int, default=None,
                   help="build the Qwen3-MoE shape with this many experts per layer (default: the dense Qwen3)")
    w.add_argument("--moe-top-k", type=int, default=None,
                   help=f"with --moe-experts: experts per token (default {MoeSpec().num_experts_per_tok})")
    w.add_argument("--moe-intermediate-size", type=int, default=None,
                   help=f"with --moe-experts: each expert's MLP width (default {MoeSpec().moe_intermediate_size})")
    w.add_argument("--checkpoints", action="store_true",
                   help="keep every evaluated model (with its eval.json) under <cache folder>.partial/")
    w.add_argument("--quiet", action="store_true", help="no progress output")
    w.add_argument("--json", action="store_true", help="print the manifest as one JSON object on stdout")

    s = sub.add_parser("stats", help="length distribution and held-out accuracy by length",
                       description="Token-length distribution of reference solutions and the model's held-out "
                                   "accuracy at rollout sampling settings, by length bucket.")
    s.add_argument("--n", type=int, default=256, help="held-out items (default 256)")
    s.add_argument("--seed", type=int, default=0, help="held-out split seed (default 0); sampling uses it too")
    s.add_argument("--profile", choices=profile_names(), default="default",
                   help="embedded profile: its task's held-out split and, unless --model, its shipped model")
    s.add_argument("--model", default=None,
                   help="model to evaluate: default the profile's shipped model ('embedded' / 'embedded:<profile>'), "
                        "or a folder or HF id")
    s.add_argument("--no-accuracy", action="store_true", help="lengths only (no model sampling)")
    s.add_argument("--max-new-tokens", type=int, default=None,
                   help="global max response length (default: the profile's, 512 default / 192 choice)")
    s.add_argument("--temperature", type=float, default=0.85)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--threads", type=int, default=None, help="torch threads (default min(2, cores))")
    s.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    e = sub.add_parser("sample", help="print a few task items")
    e.add_argument("--profile", choices=profile_names(), default="default", help="embedded profile (default: default)")
    e.add_argument("--split", choices=["train", "heldout"], default="heldout")
    e.add_argument("--n", type=int, default=3)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--json", action="store_true", help="print one JSON object {items: [...]} on stdout")
    return p


# ----------------------------------------------------------------------------- warmstart


def shape_spec(args: argparse.Namespace) -> Optional[TinySpec]:
    """The model shape the flags ask for, or None (the shipped shape) when no shape flag is given."""
    if args.hidden_size is None and args.intermediate_size is None and args.layers is None:
        return None
    hidden = DEFAULT_TINY.hidden_size if args.hidden_size is None else args.hidden_size
    if hidden % DEFAULT_TINY.num_attention_heads:
        raise DataCliError(f"--hidden-size must be a multiple of the {DEFAULT_TINY.num_attention_heads} attention "
                           f"heads, got {hidden}")
    if args.intermediate_size is not None:
        intermediate = args.intermediate_size
    else:
        intermediate = DEFAULT_TINY.intermediate_size * hidden // DEFAULT_TINY.hidden_size
    layers = DEFAULT_TINY.num_hidden_layers if args.layers is None else args.layers
    return dataclasses.replace(DEFAULT_TINY, hidden_size=hidden, intermediate_size=intermediate,
                               num_hidden_layers=layers)


def moe_spec(args: argparse.Namespace) -> Optional[MoeSpec]:
    """The MoE shape the --moe-* flags ask for, or None (dense) without --moe-experts."""
    if args.moe_experts is None:
        if args.moe_top_k is not None or args.moe_intermediate_size is not None:
            raise DataCliError("--moe-top-k / --moe-intermediate-size need --moe-experts")
        return None
    base = MoeSpec()
    try:
        return MoeSpec(num_experts=args.moe_experts,
                       num_experts_per_tok=base.num_experts_per_tok if args.moe_top_k is None else args.moe_top_k,
                       moe_intermediate_size=(base.moe_intermediate_size if args.moe_intermediate_size is None
                                              else args.moe_intermediate_size))
    except ValueError as exc:
        raise DataCliError(f"--moe-experts / --moe-top-k / --moe-intermediate-size: {exc}") from None


TRAIN_BYTES_PER_PARAMETER = 16   # fp32 weights, gradients and AdamW's two moments: 4 bytes each


def estimated_parameters(spec: TinySpec, vocab_size: int, moe: Optional[MoeSpec] = None) -> int:
    """Parameters of the tiny Qwen3 (or Qwen3-MoE, ``moe``) of shape ``spec`` with ``vocab_size`` embedding
    rows (padded), counted from the shape alone (``ulorl.models.tiny.tiny_config``: untied head, no biases,
    q/k norms of one head's width), without building it."""
    h, heads, kv = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads
    head_dim = h // heads
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2 + 2 * head_dim
    if moe is None:
        mlp = 3 * h * spec.intermediate_size
    else:
        mlp = moe.num_experts * (3 * h * moe.moe_intermediate_size + h)   # each expert's SwiGLU, its router row
    per_layer = attention + mlp + 2 * h
    return 2 * vocab_size * h + h + spec.num_hidden_layers * per_layer


def available_memory_bytes() -> Optional[int]:
    """``MemAvailable`` of /proc/meminfo (what can be allocated without swapping), else the physical
    memory; None when neither is known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def shape_memory_problem(args: argparse.Namespace) -> Optional[str]:
    """Why the shape the flags ask for cannot be warm-started here (None when it fits): its training state
    alone (:data:`TRAIN_BYTES_PER_PARAMETER` a parameter, activations not counted) exceeds the memory this
    machine has available, which would end in an allocator failure or an OOM kill, not a message."""
    spec, moe = shape_spec(args), moe_spec(args)
    if spec is None and moe is None:
        return None
    from ulorl.models.tiny import padded_vocab_size

    spec = spec or DEFAULT_TINY
    params = estimated_parameters(spec, padded_vocab_size(args.vocab_size or DEFAULT_VOCAB_SIZE), moe)
    need = params * TRAIN_BYTES_PER_PARAMETER
    free = available_memory_bytes()
    if free is None or need <= free:
        return None
    flags = " ".join(f"--{k.replace('_', '-')} {getattr(args, k)}" for k in
                     ("hidden_size", "intermediate_size", "layers", "moe_experts", "moe_intermediate_size")
                     if getattr(args, k, None) is not None)
    shipped = estimated_parameters(DEFAULT_TINY, DEFAULT_VOCAB_SIZE)
    size = f"{params / 1e9:,.1f} B" if params >= 1e9 else f"{params / 1e6:,.1f} M"
    return (f"{flags}: a model of this shape has {size} parameters; warm-starting it needs at least "
            f"{need / 2**30:,.1f} GiB of memory ({TRAIN_BYTES_PER_PARAMETER} bytes a parameter: fp32 weights, "
            f"gradients and AdamW's two moments, activations not counted) and this machine has "
            f"{free / 2**30:,.1f} GiB available; give a smaller shape (the shipped model: --hidden-size "
            f"{DEFAULT_TINY.hidden_size} --intermediate-size {DEFAULT_TINY.intermediate_size} --layers "
            f"{DEFAULT_TINY.num_hidden_layers}, {shipped / 1e6:.2f} M parameters)")


def cmd_warmstart(args: argparse.Namespace) -> dict[str, Any]:
    from ulorl.models.warmstart import ensure_warmstart, profile_config, warmstart_dir, with_overrides

    if args.target_acc is not None and not 0.0 < args.target_acc <= 1.0:
        raise DataCliError(f"--target-acc must be in (0, 1], got {args.target_acc}")
    if args.vocab_size is not None and not VOCAB_RANGE[0] <= args.vocab_size <= VOCAB_RANGE[1]:
        raise DataCliError(f"--vocab-size must be in [{VOCAB_RANGE[0]}, {VOCAB_RANGE[1]}], got {args.vocab_size}")
    for name in ("max_steps", "eval_every", "threads", "hidden_size", "intermediate_size", "layers"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise DataCliError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    problem = shape_memory_problem(args)
    if problem:
        raise DataCliError(problem)
    cfg = with_overrides(profile_config(args.profile), seed=args.seed, target_acc=args.target_acc,
                         max_steps=args.max_steps, eval_every=args.eval_every, threads=args.threads,
                         checkpoints=args.checkpoints or None, tiny=shape_spec(args), vocab_size=args.vocab_size,
                         moe=moe_spec(args))
    t0 = time.time()
    cache = warmstart_dir(cfg)
    if not args.quiet:
        _log(f"config hash {cfg.cache_key()} -> {cache}")
    folder, manifest, reused = ensure_warmstart(cfg, force=args.force, out=Path(args.out) if args.out else None,
                                                quiet=args.quiet)
    dt = time.time() - t0
    if not args.quiet:
        _log(("reused cached build" if reused else "built") + f" in {dt:.1f}s: {folder} "
             f"(status {manifest['status']}, {manifest['steps']} steps, held-out acc {manifest['final_acc']:.3f})")
    return {"folder": str(folder), "cache_dir": str(cache), "reused": reused, "seconds": round(dt, 2),
            **{k: manifest[k] for k in ("cache_key", "status", "steps", "final_acc", "train_s", "parameters")}}


# ----------------------------------------------------------------------------- stats


def _percentiles(values: list[int]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max()), "mean": round(float(a.mean()), 2)}


def _reward_fn():
    """``ulorl.reward.verify.compute_reward`` (math-verify with an integer fast path) when present."""
    try:
        from ulorl.reward.verify import compute_reward

        return compute_reward, "ulorl.reward.verify.compute_reward"
    except ImportError:
        from ulorl.data.task import is_correct

        return (lambda text, ref, truncated: float((not truncated) and is_correct(text, ref))), "exact boxed integer"


def _target_entropy(profile: str, items: list, tok, draws: int = 4, seed: int = 0) -> float:
    """Entropy per token (nats) of the warm-start target law on ``items``: mean ``-log p`` of the
    choices behind ``draws`` sampled targets per item over their tokens (EOS included)."""
    import random

    from ulorl.data.profiles import get_profile

    prof = get_profile(profile)
    rng = random.Random(seed)
    nats, ntok = 0.0, 0
    for it in items:
        for _ in range(draws):
            text, h = prof.training_solution(it, rng)
            nats += h
            ntok += len(tok(text, add_special_tokens=False)["input_ids"]) + 1
    return nats / max(ntok, 1)


def response_form(text: str) -> str:
    """``"guess"`` for a response that boxes an answer with no ``=`` line before it (a short guess),
    else ``"derivation"``. ``response_form("\\\\boxed{68}") == "guess"``."""
    head = text.rsplit("\\boxed", 1)[0] if "\\boxed" in text else text
    return "derivation" if "=" in head else "guess"


def compute_stats(n: int, seed: int, model_name: Optional[str], max_new_tokens: Optional[int] = None,
                  temperature: float = 0.85, top_p: float = 1.0, batch_size: int = 64,
                  threads: Optional[int] = None, progress: bool = True, profile: str = "default") -> dict[str, Any]:
    """Length percentiles of ``n`` held-out references of ``profile``, the target law's entropy and
    (if ``model_name``) accuracy by length bucket and mean sampling entropy per response token.

    ``max_new_tokens`` defaults to the profile's max response length (default 512, choice 192).
    ``accuracy_by_length`` lists the non-empty buckets (``bucket_counts`` lists them all).
    """
    import os

    import torch

    from ulorl.data.profiles import get_profile
    from ulorl.data.task import bucket_labels, length_bucket, reference_solution
    from ulorl.models.loading import load_policy, load_tokenizer
    from ulorl.models.tokenizer import build_tokenizer

    torch.set_num_threads(threads or min(2, os.cpu_count() or 1))
    prof = get_profile(profile)
    max_new_tokens = max_new_tokens or prof.max_response_len
    items = prof.split("heldout", n, seed=seed)
    tok = load_tokenizer(model_name) if model_name else build_tokenizer()  # the shipped tokenizer, built in code
    lens = [len(tok(reference_solution(it), add_special_tokens=False)["input_ids"]) + 1 for it in items]  # + EOS
    labels = bucket_labels(prof.length_edges)
    counts = {b: 0 for b in labels}
    for L in lens:
        counts[length_bucket(L, prof.length_edges)] += 1
    out: dict[str, Any] = {
        "profile": profile, "n": n, "seed": seed, "split": "heldout",
        "length_unit": "tokens (reference solution + EOS)",
        "length_percentiles": _percentiles(lens), "bucket_counts": counts,
        "target_entropy": round(_target_entropy(profile, items, tok, seed=seed), 4),
    }
    if model_name is None:
        return out
    model, tok = load_policy(model_name)
    reward, reward_name = _reward_fn()
    from ulorl.models.warmstart import sample_responses

    order = sorted(range(n), key=lambda i: lens[i])
    t0 = time.time()
    done = [0]

    def on_batch(k: int) -> None:
        done[0] += k
        if progress:
            _log(f"sampled {done[0]}/{n} responses ({time.time() - t0:.0f}s)")

    res = sample_responses(model, tok, [items[i].prompt for i in order], max_new_tokens, temperature, top_p,
                           batch_size=batch_size, seed=seed, on_batch=on_batch)
    correct = [0.0] * n
    resp_len = [0] * n
    forms: dict[str, list[float]] = {"guess": [], "derivation": []}
    truncated, ent, ntok = 0, 0.0, 0
    for i, r in zip(order, res):
        correct[i] = reward(r.text, items[i].answer, not r.hit_eos)
        forms[response_form(r.text)].append(correct[i])
        resp_len[i] = r.n_tokens
        truncated += not r.hit_eos
        ent += r.entropy_sum
        ntok += r.n_tokens
    by: dict[str, list[float]] = {b: [] for b in labels}
    for L, c in zip(lens, correct):
        by[length_bucket(L, prof.length_edges)].append(c)
    out.update({
        "model": model_name,
        "accuracy": sum(correct) / max(n, 1),
        "accuracy_by_length": {b: sum(v) / len(v) for b, v in by.items() if v},  # non-empty buckets only
        "sampling_entropy": ent / max(ntok, 1),
        "accuracy_by_form": {f: {"n": len(v), "accuracy": (sum(v) / len(v) if v else None)} for f, v in forms.items()},
        "response_length_percentiles": _percentiles(resp_len),
        "truncated": truncated,
        "sampling": {"temperature": temperature, "top_p": top_p, "top_k": -1, "max_new_tokens": max_new_tokens},
        "verifier": reward_name,
        "sampling_s": round(time.time() - t0, 1),
    })
    return out


def print_stats_table(st: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    lp = st["length_percentiles"]
    t = Table(title=f"reference solution length in tokens ({st['n']} held-out items of profile "
                    f"{st['profile']}, seed {st['seed']})")
    for c in ("p50", "p90", "p99", "max", "mean"):
        t.add_column(c, justify="right")
    t.add_row(*(f"{lp[c]:g}" for c in ("p50", "p90", "p99", "max", "mean")))
    con.print(t)
    t2 = Table(title="held-out accuracy by reference length" + (
        f" (model {st['model']}, T={st['sampling']['temperature']}, top_p={st['sampling']['top_p']}, "
        f"max {st['sampling']['max_new_tokens']} tokens)" if "accuracy" in st else ""))
    t2.add_column("length bucket")
    t2.add_column("items", justify="right")
    if "accuracy" in st:
        t2.add_column("accuracy", justify="right")
    for b, cnt in st["bucket_counts"].items():
        row = [b, str(cnt)]
        if "accuracy" in st:
            a = st["accuracy_by_length"].get(b)
            row.append("-" if a is None else f"{a:.3f}")
        t2.add_row(*row)
    if "accuracy" in st:
        t2.add_row("all", str(st["n"]), f"{st['accuracy']:.3f}", style="bold")
    con.print(t2)
    con.print(f"warm-start targets: {st['target_entropy']:.3f} nats/token of choice")
    if "accuracy" in st:
        con.print("by form: " + "; ".join(
            f"{f} {d['n']} responses, accuracy {'-' if d['accuracy'] is None else format(d['accuracy'], '.3f')}"
            for f, d in st["accuracy_by_form"].items()))
        con.print(f"sampling entropy: {st['sampling_entropy']:.3f} nats/token; verifier: {st['verifier']}; "
                  f"truncated: {st['truncated']}; sampling took {st['sampling_s']}s")


def cmd_stats(args: argparse.Namespace) -> dict[str, Any]:
    if args.n < 1:
        raise DataCliError(f"--n must be >= 1, got {args.n}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise DataCliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not 0.0 < args.top_p <= 1.0:
        raise DataCliError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature <= 0:
        raise DataCliError(f"--temperature must be > 0, got {args.temperature}")
    from ulorl.models.loading import ModelLoadError

    try:
        model = args.model or ("embedded" if args.profile == "default" else f"embedded:{args.profile}")
        return compute_stats(args.n, args.seed, None if args.no_accuracy else model, args.max_new_tokens,
                             args.temperature, args.top_p, args.batch_size, args.threads, profile=args.profile)
    except ModelLoadError as exc:
        raise DataCliError(str(exc)) from None


# ----------------------------------------------------------------------------- sample


def cmd_sample(args: argparse.Namespace) -> dict[str, Any]:
    from ulorl.data.profiles import get_profile
    from ulorl.data.task import reference_solution

    if args.n < 0:
        raise DataCliError(f"--n must be >= 0, got {args.n}")
    items = get_profile(args.profile).split(args.split, args.n, seed=args.seed)
    return {"items": [{"id": it.id, "prompt": it.prompt, "solution": reference_solution(it), "answer": it.answer,
                       "num_terms": it.meta["num_terms"]} for it in items]}


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "warmstart":
            res = cmd_warmstart(args)
        elif args.command == "stats":
            res = cmd_stats(args)
        else:
            res = cmd_sample(args)
    except DataCliError as exc:
        print(f"ulorl-data {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ulorl-data {args.command}: interrupted", file=sys.stderr)
        return 130
    if getattr(args, "json", False):
        emit_json(res)
    elif args.command == "stats":
        print_stats_table(res)
    elif args.command == "sample":
        for it in res["items"]:
            print(f"# {it['id']} ({it['num_terms']} terms, answer {it['answer']})\n{it['prompt']}{it['solution']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
