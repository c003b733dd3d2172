"""Warm start of the embedded model: a short supervised pass that makes it an imperfect solver.

Training: AdamW on batches of whole examples (prompt + reference solution + EOS) grouped by
length and right-padded (about ``tokens_per_step`` padded tokens per step; no cross-example
attention, positions start at 0 as in rollouts), cross-entropy on response tokens only.
Length grouping was measured ~1.5-2x faster on CPU than packing into 512-token rows with a
block-diagonal mask (the explicit 4D mask disables the fused causal attention kernel).

Stopping: every ``eval_every`` optimizer steps, ``eval_n`` held-out prompts are sampled at the
rollout settings (temperature 0.85, top_p 1.0, no top_k); training stops as soon as accuracy
reaches ``target_acc`` (accuracy jumps rather than ramps, so a step or minute budget would land
anywhere between 0 and 0.9), with ``max_steps`` as a guard. Correctness for stopping is the exact
integer match of the last ``\\boxed{}`` (``ulorl.data.task.is_correct``): the task's answers are
integers, so on well-formed outputs this agrees with the math-verify reward.

The result is cached under ``$ULORL_CACHE_DIR/warmstart/<hash>`` (default ``~/.cache/ulorl``),
keyed by a hash of every setting that changes the weights; a cached build is reused at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ulorl.data.profiles import get_profile
from ulorl.data.task import (
    DEFAULT_SPEC,
    LENGTH_EDGES,
    TaskSpec,
    bucket_labels,
    is_correct,
    length_bucket,
    reference_solution,
)
from ulorl.data.task_choice import CHOICE_SPEC, ChoiceSpec
from ulorl.data.types import PromptItem
from ulorl.models.tiny import DEFAULT_TINY, MoeSpec, TinySpec, build_tiny_model, count_parameters
from ulorl.models.tokenizer import CORPUS_SEED, CORPUS_SIZE, DEFAULT_VOCAB_SIZE, build_tokenizer

if TYPE_CHECKING:  # torch is imported inside the functions: reusing a cached build stays fast
    import torch

CODE_VERSION = 2  # bump when the training code changes the weights it produces
MANIFEST = "warmstart.json"


@dataclass(frozen=True)
class WarmStartConfig:
    """Every setting of the warm start; all but ``threads`` enter the cache key."""

    seed: int = 0
    lr: float = 2e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    tokens_per_step: int = 8192
    bf16: bool = False              # bf16 autocast (measured slower than fp32 on this CPU)
    eval_every: int = 50
    eval_n: int = 128
    eval_seed: int = 0              # held-out split seed used for the stopping evaluation
    target_acc: float = 0.35        # stop when held-out accuracy >= this
    max_steps: int = 3000
    temperature: float = 0.85
    top_p: float = 1.0
    task: Union[TaskSpec, ChoiceSpec] = DEFAULT_SPEC
    tiny: TinySpec = DEFAULT_TINY
    vocab_size: int = DEFAULT_VOCAB_SIZE
    profile: str = "default"        # embedded profile whose task trains (ulorl.data.profiles)
    min_bucket_acc: float = 0.0     # also require this held-out accuracy in every reference-length bucket
    moe: Optional[MoeSpec] = None   # the Qwen3-MoE shape (every MLP top-k routed experts); None: dense Qwen3
    moe_init: str = "upcycle"       # with moe: 'upcycle' (from the shipped dense embedded model) or 'random'
    threads: Optional[int] = field(default=None, compare=False)
    checkpoints: bool = field(default=False, compare=False)  # keep each evaluated model in <out>.partial/

    def key_dict(self) -> dict:
        d = asdict(self)
        d.pop("threads")
        d.pop("checkpoints")
        if self.profile == "default":  # fields added with the second profile: the default's key is unchanged
            d.pop("profile")
            d.pop("min_bucket_acc")
        if self.moe is None:  # added with the MoE shape: a dense build's key is unchanged
            d.pop("moe")
            d.pop("moe_init")
        elif self.moe_init == "upcycle":
            d["upcycle_source"] = dense_source_key()
        d["code_version"] = CODE_VERSION
        d["tokenizer_corpus"] = [CORPUS_SEED, CORPUS_SIZE]
        return d

    def cache_key(self) -> str:
        blob = json.dumps(self.key_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


MOE_INITS: tuple[str, ...] = ("upcycle", "random")


def dense_source_dir() -> Path:
    """The shipped dense default model an MoE build is upcycled from."""
    from ulorl.models.loading import embedded_model_dir

    return embedded_model_dir("default")


def dense_source_key() -> str:
    """The upcycling source's own warm-start cache key (its manifest), or its weights' size when it has none."""
    d = dense_source_dir()
    f = d / MANIFEST
    if f.is_file():
        return str(json.loads(f.read_text()).get("cache_key", ""))
    w = d / "model.safetensors"
    return f"size:{w.stat().st_size}" if w.is_file() else "missing"


def _init_moe(model, cfg: WarmStartConfig) -> None:
    """``cfg.moe_init``: keep the random init, or upcycle the shipped dense model (``upcycle_from_dense``)."""
    if cfg.moe_init not in MOE_INITS:
        raise ValueError(f"moe_init must be one of {MOE_INITS}, got {cfg.moe_init!r}")
    if cfg.moe_init == "random":
        return
    from safetensors.torch import load_file

    from ulorl.models.tiny import upcycle_from_dense

    w = dense_source_dir() / "model.safetensors"
    if not w.is_file():
        raise FileNotFoundError(f"upcycling needs the dense embedded model at {w}; build it with "
                                "`ulorl-data warmstart --out platform/ulorl/assets/embedded` or use moe_init 'random'")
    upcycle_from_dense(model, load_file(str(w)))


def profile_config(profile: str = "default") -> WarmStartConfig:
    """The shipped warm-start recipe of an embedded profile."""
    get_profile(profile)
    if profile == "default":
        return WarmStartConfig()
    # choice: smaller steps (more updates in the same CPU time), stop once every length bucket is
    # solved often enough; its targets carry ~0.145 nats/token of choice (measured, see stats)
    return WarmStartConfig(profile="choice", task=CHOICE_SPEC, tokens_per_step=4096, eval_every=100,
                           target_acc=0.4, min_bucket_acc=0.25, max_steps=6000)


def cache_root() -> Path:
    """``$ULORL_CACHE_DIR`` or ``~/.cache/ulorl``."""
    env = os.environ.get("ULORL_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ulorl"


def warmstart_dir(cfg: WarmStartConfig) -> Path:
    return cache_root() / "warmstart" / cfg.cache_key()


def is_complete(d: Path) -> bool:
    """A build folder is usable once its manifest exists (written last)."""
    return (d / MANIFEST).is_file() and (d / "config.json").is_file()


# ----------------------------------------------------------------------------- data


def encode_example(tok, item: PromptItem, solution: Optional[str] = None) -> tuple[list[int], list[int]]:
    """``(ids, loss_mask)`` of prompt + solution (default: the reference) + EOS; mask is 1 on response tokens."""
    p = tok(item.prompt, add_special_tokens=False)["input_ids"]
    text = reference_solution(item) if solution is None else solution
    r = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + r, [0] * len(p) + [1] * len(r)


@dataclass
class Batch:
    """Right-padded examples of similar length. ids/loss_mask: [B, T]; n_real: non-pad tokens."""

    ids: torch.Tensor
    loss_mask: torch.Tensor
    n_real: int = 0


def pad_batch(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> Batch:
    """Right-pad examples to the longest one. Under a causal mask a right pad never influences
    the real tokens before it, so no attention mask is needed (the fast causal kernel runs)."""
    import torch

    T = max(len(e[0]) for e in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    lm = torch.zeros((len(examples), T), dtype=torch.float32)
    for b, (e_ids, e_mask) in enumerate(examples):
        ids[b, : len(e_ids)] = torch.tensor(e_ids)
        lm[b, : len(e_ids)] = torch.tensor(e_mask, dtype=torch.float32)
    return Batch(ids, lm, n_real=sum(len(e[0]) for e in examples))


def group_by_length(
    examples: Sequence[tuple[list[int], list[int]]], tokens_per_batch: int
) -> list[list[tuple[list[int], list[int]]]]:
    """Sort examples by length and cut them into groups whose padded size B x T_max stays
    within ``tokens_per_batch`` (a group always holds at least one example)."""
    groups: list[list[tuple[list[int], list[int]]]] = []
    cur: list[tuple[list[int], list[int]]] = []
    for ex in sorted(examples, key=lambda e: len(e[0])):
        if cur and (len(cur) + 1) * len(ex[0]) > tokens_per_batch:
            groups.append(cur)
            cur = []
        cur.append(ex)
    if cur:
        groups.append(cur)
    return groups


def batch_stream(tok, cfg: WarmStartConfig, pool_batches: int = 8) -> Iterator[Batch]:
    """Endless length-grouped batches of about ``tokens_per_step`` padded tokens (train split).

    Examples are drawn ``pool_batches`` steps' worth at a time, grouped by length (little
    padding, and each group costs attention only for its own length), and the groups of a pool
    are visited in a seeded random order.
    """
    import random

    prof = get_profile(cfg.profile)
    items = prof.iter_split("train", cfg.seed, cfg.task)
    rng = random.Random(cfg.seed)
    sol_rng = random.Random(cfg.seed + 1)  # the target law's choices (profiles with many solutions)
    while True:
        pool, total = [], 0
        while total < pool_batches * cfg.tokens_per_step:
            item = next(items)
            ex = encode_example(tok, item, prof.training_solution(item, sol_rng)[0])
            if len(ex[0]) > cfg.tokens_per_step:
                raise ValueError(f"a task example of {len(ex[0])} tokens exceeds tokens_per_step")
            pool.append(ex)
            total += len(ex[0])
        groups = group_by_length(pool, cfg.tokens_per_step)
        rng.shuffle(groups)
        for g in groups:
            yield pad_batch(g, tok.pad_token_id)


def batch_loss(model, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over response tokens of a batch (scalar); an MoE model adds its own
    load-balancing loss times its ``router_aux_loss_coef`` (as its forward does with ``labels``)."""
    import torch

    moe = getattr(model.config, "num_experts", 0) > 0 and hasattr(model.config, "router_aux_loss_coef")
    out = model(input_ids=batch.ids, output_router_logits=True) if moe else model(input_ids=batch.ids)
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    m = batch.loss_mask[:, 1:]
    loss = (nll * m).sum() / m.sum().clamp_min(1.0)
    if moe and out.aux_loss is not None:
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return loss


# ----------------------------------------------------------------------------- sampling


@dataclass
class SampledResponse:
    """One sampled response: decoded text (no EOS), whether EOS was sampled, the number of sampled
    tokens (EOS included) and the sum over them of the sampling distribution's entropy (nats)."""

    text: str
    hit_eos: bool
    n_tokens: int
    entropy_sum: float


def sample_responses(
    model,
    tok,
    prompts: Sequence[str],
    max_new_tokens: int | Sequence[int] = 512,
    temperature: float = 0.85,
    top_p: float = 1.0,
    batch_size: int = 64,
    seed: int = 0,
    on_batch: Optional[Callable[[int], None]] = None,
) -> list[SampledResponse]:
    """Sample one response per prompt with the entropy of every sampling step; prompt order kept.

    Rollout settings by default (temperature 0.85, top_p 1.0, top_k off). The entropy is that of
    the distribution actually sampled from (logits / T after top-p), summed over the response's
    tokens up to and including EOS. ``max_new_tokens`` may be one value per prompt (a batch uses
    its largest); a response that stops without EOS has ``hit_eos=False`` (truncated).
    """
    import torch

    from ulorl.algo.entropy import token_entropy

    n = len(prompts)
    caps = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    was_training = model.training
    model.eval()
    eos = tok.eos_token_id
    out: list[SampledResponse] = []
    gen = torch.Generator().manual_seed(seed)
    try:
        for s in range(0, n, batch_size):
            chunk = list(prompts[s : s + batch_size])
            cap = max(caps[s : s + batch_size])
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            res = model.generate(
                **enc,
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=cap,
                eos_token_id=eos,
                pad_token_id=tok.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            new = res.sequences[:, enc["input_ids"].shape[1] :].tolist()
            # generate's scores are the processed logits (/ T, top-p'd to -inf): their softmax was sampled
            ent = torch.stack([token_entropy(sc) for sc in res.scores], dim=1)  # [B, steps]
            for b, row in enumerate(new):
                hit = eos in row
                n_tok = row.index(eos) + 1 if hit else len(row)
                text_ids = row[: n_tok - 1] if hit else row
                out.append(SampledResponse(tok.decode(text_ids, skip_special_tokens=True), hit, n_tok,
                                           float(ent[b, :n_tok].sum())))
            if on_batch:
                on_batch(len(chunk))
    finally:
        model.train(was_training)
    return out


def generate_responses(
    model,
    tok,
    prompts: Sequence[str],
    max_new_tokens: int | Sequence[int] = 512,
    temperature: float = 0.85,
    top_p: float = 1.0,
    batch_size: int = 64,
    seed: int = 0,
    on_batch: Optional[Callable[[int], None]] = None,
) -> list[tuple[str, bool]]:
    """``(text, hit_eos)`` of ``sample_responses`` (same sampling, same order)."""
    res = sample_responses(model, tok, prompts, max_new_tokens, temperature, top_p, batch_size, seed, on_batch)
    return [(r.text, r.hit_eos) for r in res]


def heldout_accuracy(
    model, tok, items: Sequence[PromptItem], temperature: float = 0.85, top_p: float = 1.0,
    seed: int = 0, slack: float = 1.5, batch_size: int = 64,
) -> tuple[float, list[bool]]:
    """Accuracy (exact boxed integer) on ``items`` with a per-item cap of slack x reference + 16 tokens.

    Items are sampled sorted by reference length; returns ``(accuracy, correct)`` in item order.
    """
    ref_len = [len(tok(reference_solution(it), add_special_tokens=False)["input_ids"]) + 1 for it in items]
    order = sorted(range(len(items)), key=lambda i: ref_len[i])
    caps = [int(slack * ref_len[i]) + 16 for i in order]
    res = generate_responses(
        model, tok, [items[i].prompt for i in order], caps, temperature, top_p, batch_size=batch_size, seed=seed
    )
    correct = [False] * len(items)
    for i, (text, hit) in zip(order, res):
        correct[i] = hit and is_correct(text, items[i].answer)
    return sum(correct) / max(len(items), 1), correct


def heldout_eval(
    model, tok, items: Sequence[PromptItem], temperature: float = 0.85, top_p: float = 1.0, seed: int = 0,
    slack: float = 1.5, batch_size: int = 64, edges: Sequence[int] = LENGTH_EDGES,
) -> dict[str, Any]:
    """Accuracy, accuracy by reference-length bucket and mean sampling entropy per token on ``items``.

    Same sampling and per-item caps as ``heldout_accuracy``; ``entropy`` is token-weighted over
    every sampled response token (EOS included), ``acc_by_length`` is None for an empty bucket.
    """
    ref_len = [len(tok(reference_solution(it), add_special_tokens=False)["input_ids"]) + 1 for it in items]
    order = sorted(range(len(items)), key=lambda i: ref_len[i])
    caps = [int(slack * ref_len[i]) + 16 for i in order]
    res = sample_responses(model, tok, [items[i].prompt for i in order], caps, temperature, top_p,
                           batch_size=batch_size, seed=seed)
    correct = [False] * len(items)
    ent, ntok = 0.0, 0
    for i, r in zip(order, res):
        correct[i] = r.hit_eos and is_correct(r.text, items[i].answer)
        ent += r.entropy_sum
        ntok += r.n_tokens
    by: dict[str, list[bool]] = {b: [] for b in bucket_labels(edges)}
    for L, c in zip(ref_len, correct):
        by[length_bucket(L, edges)].append(c)
    return {"acc": sum(correct) / max(len(items), 1),
            "acc_by_length": {b: (sum(v) / len(v) if v else None) for b, v in by.items()},
            "entropy": ent / max(ntok, 1), "mean_len": ntok / max(len(items), 1)}


def meets_targets(ev: dict[str, Any], cfg: WarmStartConfig) -> bool:
    """Stopping rule: overall accuracy >= target and, if set, every non-empty bucket >= min_bucket_acc."""
    if ev["acc"] < cfg.target_acc:
        return False
    return cfg.min_bucket_acc <= 0 or all(a >= cfg.min_bucket_acc
                                          for a in ev["acc_by_length"].values() if a is not None)


# ----------------------------------------------------------------------------- training


class _Reporter:
    """Progress to stderr: a rich bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, quiet: bool = False):
        self.quiet = quiet
        self.total = total
        self.live = sys.stderr.isatty() and not quiet
        self.t0 = self.last = time.time()
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("warm start"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=Console(stderr=True),
            )
            self.task = self.progress.add_task("warm", total=total, info="")
            self.progress.start()

    def step(self, step: int, info: str) -> None:
        if self.live:
            self.progress.update(self.task, completed=step, info=info)
        elif not self.quiet and time.time() - self.last >= 30:  # plain line every 30 s off a terminal
            self.last = time.time()
            self.log(f"step {step}/{self.total}: {info}")

    def log(self, msg: str) -> None:
        if self.quiet:
            return
        line = f"[warmstart {time.time() - self.t0:6.0f}s] {msg}"
        if self.live:
            self.progress.console.print(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.live:
            self.progress.stop()


def train_warmstart(cfg: WarmStartConfig, out_dir: Path, quiet: bool = False) -> dict:
    """Run the warm start and save model + tokenizer + manifest into ``out_dir``; returns the manifest."""
    import torch

    threads = cfg.threads or min(2, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    t0 = time.time()
    tok = build_tokenizer(cfg.vocab_size)
    model = build_tiny_model(tok, cfg.tiny, seed=cfg.seed, moe=cfg.moe)
    if cfg.moe is not None:
        _init_moe(model, cfg)
    model.train()
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=cfg.betas,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    prof = get_profile(cfg.profile)
    eval_items = prof.make_split("heldout", cfg.eval_n, seed=cfg.eval_seed, spec=cfg.task)
    stream = batch_stream(tok, cfg)
    partial = Path(out_dir).with_name(Path(out_dir).name + ".partial")
    rep = _Reporter(cfg.max_steps, quiet)
    rep.log(f"{count_parameters(model):,} parameters, vocab {len(tok)}, {threads} threads, target acc {cfg.target_acc}")
    history: list[dict] = []
    status, acc, step, loss_ema, tokens = "max_steps", 0.0, 0, float("nan"), 0
    try:
        for step in range(1, cfg.max_steps + 1):
            batch = next(stream)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                loss = batch_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            tokens += batch.n_real
            lv = float(loss.detach())
            loss_ema = lv if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * lv
            rep.step(step, f"loss {loss_ema:.3f} acc {acc:.2f}")
            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                te = time.time()
                if cfg.profile == "default":  # the default's recipe, unchanged
                    acc, _ = heldout_accuracy(model, tok, eval_items, cfg.temperature, cfg.top_p,
                                              seed=cfg.eval_seed + step)
                    ev = {"acc": acc}
                else:
                    ev = heldout_eval(model, tok, eval_items, cfg.temperature, cfg.top_p, seed=cfg.eval_seed + step,
                                      edges=prof.length_edges)
                    acc = ev["acc"]
                history.append({"step": step, "loss": round(loss_ema, 4), **ev,
                                "elapsed_s": round(time.time() - t0, 1), "eval_s": round(time.time() - te, 1)})
                rep.log(f"step {step}: loss {loss_ema:.3f}, held-out " + _fmt_eval(ev)
                        + f" (eval {time.time() - te:.1f}s)")
                if cfg.checkpoints:
                    _save_checkpoint(model, tok, partial / f"step{step:05d}", history[-1])
                if meets_targets(ev, cfg) if cfg.profile != "default" else acc >= cfg.target_acc:
                    status = "target_reached"
                    break
    finally:
        rep.close()
    model.eval()
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    _portable_tokenizer_class(tmp)
    manifest = {
        "cache_key": cfg.cache_key(),
        "config": cfg.key_dict(),
        "status": status,
        "steps": step,
        "tokens": tokens,
        "final_acc": acc,
        "parameters": count_parameters(model),
        "train_s": round(time.time() - t0, 1),
        "threads": threads,
        "torch": torch.__version__,
        "history": history,
        "accuracy_check": "exact integer match of the last \\boxed{} (ulorl.data.task.is_correct)",
    }
    manifest = json.loads(json.dumps(manifest))  # the same plain-JSON form a reuse reads back
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out_dir)
    rep.log(f"{status} after {step} steps, acc {acc:.3f}, {manifest['train_s']}s -> {out_dir}")
    return manifest


def _fmt_eval(ev: dict[str, Any]) -> str:
    out = f"acc {ev['acc']:.3f}"
    if "entropy" in ev:
        buckets = " ".join(f"{b}:{'-' if a is None else f'{a:.2f}'}" for b, a in ev["acc_by_length"].items())
        out += f" [{buckets}] entropy {ev['entropy']:.3f} nats/token, mean len {ev['mean_len']:.1f}"
    return out


def _save_checkpoint(model, tok, folder: Path, record: dict) -> None:
    """A loadable snapshot of the model under training (weights, tokenizer, its evaluation)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    _portable_tokenizer_class(folder)
    (folder / "eval.json").write_text(json.dumps(record, indent=2))


def _portable_tokenizer_class(folder: Path) -> None:
    """transformers 5 writes ``TokenizersBackend``, unknown to 4.x; ``PreTrainedTokenizerFast``
    loads the same tokenizer in both."""
    f = folder / "tokenizer_config.json"
    cfg = json.loads(f.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    f.write_text(json.dumps(cfg, indent=2) + "\n")


def ensure_warmstart(
    cfg: WarmStartConfig = WarmStartConfig(), force: bool = False, out: Optional[Path] = None, quiet: bool = False,
) -> tuple[Path, dict, bool]:
    """Build (or reuse) the cached warm start; optionally copy it to ``out``.

    Returns ``(folder, manifest, reused)`` where folder is ``out`` when given, else the cache folder.
    """
    d = warmstart_dir(cfg)
    reused = is_complete(d) and not force
    if reused:
        manifest = json.loads((d / MANIFEST).read_text())
    else:
        manifest = train_warmstart(cfg, d, quiet=quiet)
    if out is not None:
        out = Path(out)
        if out.resolve() != d.resolve():
            out.mkdir(parents=True, exist_ok=True)
            for f in d.iterdir():
                if f.is_file():
                    shutil.copy2(f, out / f.name)
                    os.chmod(out / f.name, 0o644)  # save_pretrained writes 0600 safetensors
        return out, manifest, reused
    return d, manifest, reused


def with_overrides(cfg: WarmStartConfig, **kw) -> WarmStartConfig:
    return dataclasses.replace(cfg, **{k: v for k, v in kw.items() if v is not None})
