"""Rollout benchmark: what segment count S buys under the two batching regimes (``ulorl-bench rollout``).

Side by side in one process, with the same model, prompts (the embedded task's train split) and
seeds, each setting (S, regime) drives its own ``SegmentScheduler`` over its own ``HFEngine`` at
the same global max length. There is no training: the policy is fixed (``policy_version`` stays
0), so the numbers isolate the rollout effect. Each setting first runs S warm-up steps (its
unfinished pool is then in steady state: every sample finishes within S steps), then every
setting decodes the SAME measured prompt sequence, ``steps`` steps each (from ``--seconds`` and
the warm-up step times), split round robin over ``rounds`` rounds so machine noise hits every
setting alike and comparisons are paired (the S = 1 step time varies a lot with the longest
prompt of its batch).

Default global max: 256 tokens. The embedded task's responses are long-tailed (mean ~50 tokens,
p99 ~270, none above ~340 with the shipped model): at 256 the tail reaches the global max as in
the paper (a few percent truncated, mean/max ~0.19), while at 512 no response comes near the
max and S = 2 (segments of 256) or S = 4 change almost nothing (``--max-len 512`` shows it).

Per setting (``results``): median step time, finished samples per second (EOS or truncated),
useful tokens per second, decode utilization (useful tokens / row-slots decoded), prefill share of
time, decode iterations per finished sample (hardware independent), mean batch rows, mean
unfinished pool, prefill tokens per finished sample, ratio to S = 1 of the same regime. Plus the
measured cost of one decode forward against rows and context (``cost_curve``), prefill cost
(``prefill_curve``, ``prefill_ms_per_token``), the observed response lengths (``lengths``,
``group_lengths``) and, compactly, the prefix structure of every released group for the
simulator's prefill model (``ulorl-sim validate``): ``prefix_prompts`` (token ids of each distinct
prompt, in the order of the bench's prompt list) and ``group_prefix`` = per group
``{"prompt": index, "lengths": [...], "lcp": [...]}`` with the G response lengths in
lexicographic order of the responses and the G - 1 longest common prefixes of neighbours in that
order (``ulorl.rollout.prefix.adjacent_lcps``; the LCP of any two is the minimum between them).
"""

from __future__ import annotations

import os
import platform as _platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ulorl.rollout.prefix import adjacent_lcps
from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler
from ulorl.rollout.types import Engine, GenerationRequest, SamplingParams

Progress = Optional[Callable[[str], None]]


@dataclass
class BenchConfig:
    """Settings of one benchmark run (all printed and stored in the JSON ``config``)."""

    prompts: int = 16                 # new prompts per step
    group: int = 8                    # G responses per prompt
    max_len: int = 256                # global max response length (tokens); see the module docstring
    segments: tuple[int, ...] = (1, 2, 4, 8)
    regimes: tuple[str, ...] = ("static", "compact")
    seconds: float = 50.0             # target measured seconds per setting (sets `steps` when None)
    steps: Optional[int] = None       # measured steps per setting, the same prompts for every setting
    rounds: int = 4                   # round-robin rounds over the settings
    warmup: Optional[int] = None      # warm-up steps per setting; None = S (fills the unfinished pool)
    device: str = "cpu"
    model: str = "embedded"
    # torch threads (1: on a shared 2-core box 2 threads thrash); None = torch's default
    threads: Optional[int] = 1
    temperature: float = 0.85
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0
    cost_rows: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    cost_contexts: Optional[tuple[int, ...]] = None   # None = (64, max_len / 2, max_len + 64)
    cost_iters: int = 8               # decode forwards timed per cost-curve point

    def validate(self) -> None:
        if self.prompts < 1 or self.group < 1 or self.max_len < 1:
            raise ValueError("--prompts, --group and --max-len must be >= 1")
        if not self.segments or any(s < 1 or s > self.max_len for s in self.segments):
            raise ValueError(f"--segments must be in 1..max_len ({self.max_len}), got {list(self.segments)}")
        bad = [s for s in self.segments if self.max_len % s]
        if bad:
            raise ValueError(f"--max-len {self.max_len} must be divisible by every segment count, not by {bad}")
        if not self.regimes or any(r not in ("static", "compact") for r in self.regimes):
            raise ValueError(f"--regimes must be a subset of static,compact, got {list(self.regimes)}")
        if self.seconds <= 0 or self.rounds < 1:
            raise ValueError("--seconds must be > 0 and --rounds >= 1")
        if self.steps is not None and self.steps < 1:
            raise ValueError("--steps must be >= 1")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError("--warmup must be >= 0")


@dataclass
class StepRecord:
    """One measured scheduler step of one setting."""

    wall_s: float
    completed: int
    truncated: int
    useful_tokens: int
    row_slots: int
    iterations: int
    prefill_s: float
    prefill_tokens: int
    context_tokens: int
    batch_rows: int
    carried_rows: int
    unfinished: int
    round: int = 0
    admitted: int = 0


@dataclass
class _Setting:
    segments: int
    regime: str
    engine: Engine
    scheduler: SegmentScheduler
    prompt_iter: Iterator[PromptRequest]
    records: list[StepRecord] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    group_lengths: list[list[int]] = field(default_factory=list)
    group_prefix: list[tuple[tuple[int, ...], list[int], list[int]]] = field(default_factory=list)
    measured_s: float = 0.0

    @property
    def name(self) -> str:
        return f"S={self.segments} {self.regime}"


def _cycle(items: Sequence[PromptRequest]) -> Iterator[PromptRequest]:
    while True:
        yield from items


def _run_step(st: _Setting, cfg: BenchConfig, record: bool, rnd: int = 0) -> float:
    new = [next(st.prompt_iter) for _ in range(st.scheduler.prompts_wanted())]
    t0 = time.perf_counter()
    res = st.scheduler.step(new, policy_version=0)
    wall = time.perf_counter() - t0
    if record:
        es = res.engine_stats
        st.records.append(StepRecord(
            wall_s=wall, completed=res.finished + res.truncated, truncated=res.truncated,
            useful_tokens=res.decoded_tokens,
            row_slots=es.row_slots if es else 0, iterations=es.decode_iterations if es else 0,
            prefill_s=es.prefill_s if es else 0.0, prefill_tokens=es.prefill_tokens if es else 0,
            context_tokens=int(getattr(es, "context_tokens", 0) or 0) if es else 0,
            batch_rows=res.batch_rows, carried_rows=res.carried_rows, unfinished=res.unfinished, round=rnd,
            admitted=res.admitted))
        st.lengths.extend(s.response_len for s in res.completed)
        st.group_lengths.extend([s.response_len for s in g] for g in res.groups)
        st.group_prefix.extend(group_prefix_record(g) for g in res.groups)
        st.measured_s += wall
    return wall


def group_prefix_record(group: Sequence[Any]) -> tuple[tuple[int, ...], list[int], list[int]]:
    """``(prompt ids, response lengths in lexicographic order, adjacent LCPs)`` of one released group
    (samples with ``prompt_ids`` and ``response_ids``)."""
    resp = [list(s.response_ids) for s in group]
    order, lcps = adjacent_lcps(resp)
    return tuple(group[0].prompt_ids), [len(resp[i]) for i in order], lcps


def prefix_table(records: Sequence[tuple[tuple[int, ...], list[int], list[int]]],
                 prompts: Sequence[PromptRequest]) -> dict[str, Any]:
    """``{"prefix_prompts", "group_prefix"}`` (module docstring) from group records; prompts are
    numbered in the order of ``prompts`` (unknown ones after them, in order of appearance)."""
    pos: dict[tuple[int, ...], int] = {}
    for i, p in enumerate(prompts):
        pos.setdefault(tuple(p.prompt_ids), i)
    seen = {t: k for k, t in enumerate(dict.fromkeys(r[0] for r in records))}
    used = sorted(seen, key=lambda t: pos.get(t, len(pos) + seen[t]))
    index = {t: i for i, t in enumerate(used)}
    return {"prefix_prompts": [list(t) for t in used],
            "group_prefix": [{"prompt": index[t], "lengths": lens, "lcp": lcps} for t, lens, lcps in records]}


def summarize(st: _Setting) -> dict[str, Any]:
    """One ``results`` row from a setting's measured steps."""
    recs = st.records
    total = sum(r.wall_s for r in recs)
    done = sum(r.completed for r in recs)
    useful = sum(r.useful_tokens for r in recs)
    slots = sum(r.row_slots for r in recs)
    n = max(1, len(recs))
    per_round = []
    for rnd in sorted({r.round for r in recs}):
        rr = [r for r in recs if r.round == rnd]
        t = sum(r.wall_s for r in rr)
        per_round.append(sum(r.completed for r in rr) / t if t > 0 else 0.0)
    se = (statistics.stdev(per_round) / len(per_round) ** 0.5) if len(per_round) > 1 else None
    return {
        "segments": st.segments,
        "regime": st.regime,
        "steps": len(recs),
        "measured_s": total,
        "step_time_s": statistics.median(r.wall_s for r in recs) if recs else None,
        "finished_per_s": done / total if total > 0 else 0.0,
        "tokens_per_s": useful / total if total > 0 else 0.0,
        "decode_utilization": useful / slots if slots else None,
        "prefill_frac": sum(r.prefill_s for r in recs) / total if total > 0 else None,
        "iters_per_finished": sum(r.iterations for r in recs) / done if done else None,
        "ratio_vs_s1": None,
        "mean_rows": sum(r.batch_rows for r in recs) / n,
        "mean_unfinished": sum(r.unfinished for r in recs) / n,
        "prefill_tokens_per_finished": sum(r.prefill_tokens for r in recs) / done if done else None,
        "context_tokens_per_finished": sum(r.context_tokens for r in recs) / done if done else None,
        "finished": done,
        "truncated": sum(r.truncated for r in recs),
        "mean_response_len": sum(st.lengths) / len(st.lengths) if st.lengths else None,
        # steady state: finished/s == admitted/s; they differ by the pool change over the window
        "admitted_per_s": sum(r.admitted for r in recs) / total if total > 0 else 0.0,
        "pool_start": (recs[0].unfinished + recs[0].completed - recs[0].admitted) if recs else None,
        "pool_end": recs[-1].unfinished if recs else None,
        "finished_per_s_rounds": per_round,
        "finished_per_s_se": se,
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``ratio_vs_s1`` = finished/s over the S = 1 row of the same regime (None without one)."""
    base = {r["regime"]: r["finished_per_s"] for r in rows if r["segments"] == 1}
    for r in rows:
        b = base.get(r["regime"])
        r["ratio_vs_s1"] = r["finished_per_s"] / b if b else None


def run_settings(
    cfg: BenchConfig,
    engine_factory: Callable[[str], Engine],
    prompts: Sequence[PromptRequest],
    *,
    progress: Progress = None,
) -> tuple[list[dict[str, Any]], list[int], list[list[int]], dict[str, Any]]:
    """Warm up, then measure every (S, regime) setting round robin (module docstring).

    ``engine_factory(regime)`` builds one engine per setting. Returns ``(results, lengths,
    group_lengths, prefix)``: lengths of every sample completed while measuring, of released
    groups, and the released groups' prefix structure (``prefix_table``).
    """
    cfg.validate()
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed)
    # every setting decodes the same prompt sequence while measured (paired comparison); warm-up
    # steps draw from the other half of the list
    warm_prompts = list(prompts[len(prompts) // 2:]) or list(prompts)
    settings: list[_Setting] = []
    for regime in cfg.regimes:
        for s in cfg.segments:
            eng = engine_factory(regime)
            sched = SegmentScheduler(eng, segments=s, max_response_len=cfg.max_len, group_size=cfg.group,
                                     prompts_per_step=cfg.prompts, sampling=sampling, seed=cfg.seed)
            settings.append(_Setting(s, regime, eng, sched, _cycle(warm_prompts)))
    warm_time: list[float] = []
    for st in settings:
        k = st.segments if cfg.warmup is None else cfg.warmup
        t0 = time.perf_counter()
        times = [_run_step(st, cfg, record=False) for _ in range(k)]
        warm_time.append(statistics.mean(times) if times else 0.0)
        st.prompt_iter = _cycle(prompts)
        _say(progress, f"warm-up {st.name}: {k} steps in {time.perf_counter() - t0:.1f}s, "
                       f"unfinished pool {st.scheduler.unfinished}")
    steps = cfg.steps
    if steps is None:
        mean_step = statistics.mean(warm_time) if warm_time and statistics.mean(warm_time) > 0 else 1.0
        steps = max(cfg.rounds, int(round(cfg.seconds / mean_step)))
    per_round = [steps // cfg.rounds + (1 if r < steps % cfg.rounds else 0) for r in range(cfg.rounds)]
    _say(progress, f"measuring {steps} steps per setting ({per_round} per round), same prompts for all")
    for rnd, k in enumerate(per_round):
        for st in settings:
            spent = sum(_run_step(st, cfg, record=True, rnd=rnd) for _ in range(k))
            _say(progress, f"round {rnd + 1}/{cfg.rounds} {st.name}: {k} steps in {spent:.1f}s")
    cfg.steps = steps
    results = [summarize(st) for st in settings]
    add_ratios(results)
    lengths = [x for st in settings for x in st.lengths]
    groups = [g for st in settings for g in st.group_lengths]
    prefix = prefix_table([r for st in settings for r in st.group_prefix], prompts)
    return results, lengths, groups, prefix


def _say(progress: Progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


# ----------------------------------------------------------------------------- cost curves


def measure_cost_curve(model, *, device: str, rows: Sequence[int], contexts: Sequence[int], iters: int,
                       vocab_hi: int, seed: int = 0, progress: Progress = None) -> list[dict[str, Any]]:
    """ms per decode forward of ``HFEngine`` at ``rows`` x ``context`` (one shared prompt of that
    length, static regime, EOS disabled, ``iters`` forwards timed)."""
    import torch

    from ulorl.rollout.engines.hf import HFEngine

    eng = HFEngine(model, eos_token_id=-1, pad_token_id=0, device=device, batching="static")
    g = torch.Generator().manual_seed(seed)
    sp = SamplingParams(temperature=1.0, seed=seed)
    out = []
    eng.generate([GenerationRequest(0, [1, 2, 3], [], 3)], sp)  # warm
    for c in contexts:
        prompt = torch.randint(2, vocab_hi, (c,), generator=g).tolist()
        for r in rows:
            reqs = [GenerationRequest(i, prompt, [], iters + 1, seed=i) for i in range(r)]
            eng.generate(reqs, sp)
            st = eng.last_stats
            ms = st.decode_s / max(1, st.forwards) * 1000.0
            out.append({"rows": r, "context": c, "ms_per_iter": ms})
            _say(progress, f"cost curve: rows {r:4d} context {c:4d}: {ms:7.2f} ms/iter")
    return out


def measure_prefill_curve(model, *, device: str, shapes: Sequence[tuple[int, int]], vocab_hi: int,
                          seed: int = 0, progress: Progress = None) -> list[dict[str, Any]]:
    """Prefill time of ``rows`` distinct random contexts of ``context`` tokens: ``{tokens, ms}``."""
    import torch

    from ulorl.rollout.engines.hf import HFEngine

    eng = HFEngine(model, eos_token_id=-1, pad_token_id=0, device=device, batching="static")
    g = torch.Generator().manual_seed(seed + 1)
    sp = SamplingParams(temperature=1.0, seed=seed)
    out = []
    for r, c in shapes:
        reqs = [GenerationRequest(i, torch.randint(2, vocab_hi, (c,), generator=g).tolist(), [], 1, seed=i)
                for i in range(r)]
        eng.generate(reqs, sp)
        st = eng.last_stats
        out.append({"rows": r, "context": c, "tokens": st.prefill_tokens, "ms": st.prefill_s * 1000.0})
        _say(progress, f"prefill: {r} x {c} tokens: {st.prefill_s * 1000:.1f} ms")
    return out


# ----------------------------------------------------------------------------- whole benchmark


def embedded_prompts(tokenizer, n: int, seed: int) -> list[PromptRequest]:
    """The first ``n`` train-split items of the embedded task, tokenised (no special tokens)."""
    from ulorl.data.prompts import build_prompt
    from ulorl.data.task import make_split

    out = []
    for item in make_split("train", n, seed=seed):
        text = build_prompt(item, tokenizer)
        ids = tokenizer.encode(text, add_special_tokens=False)
        out.append(PromptRequest(prompt_ids=list(ids), answer=item.answer, prompt_text=text,
                                 meta={"id": item.id}))
    return out


def run_rollout_bench(cfg: BenchConfig, *, progress: Progress = None) -> dict[str, Any]:
    """The whole ``ulorl-bench rollout`` run; returns the JSON object (module docstring)."""
    import torch

    from ulorl.models.loading import load_policy
    from ulorl.rollout.engines.hf import HFEngine

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    t_start = time.perf_counter()
    model, tok = load_policy(cfg.model, device=cfg.device)
    model.eval()
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    n_prompts = max(4096, cfg.prompts * 64)
    prompts = embedded_prompts(tok, n_prompts, cfg.seed)
    _say(progress, f"model {cfg.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params) "
                   f"on {cfg.device}, {torch.get_num_threads()} threads; {len(prompts)} prompts")

    def factory(regime: str) -> Engine:
        return HFEngine(model, eos_token_id=eos, pad_token_id=pad, device=cfg.device, batching=regime)  # type: ignore[arg-type]

    results, lengths, groups, prefix = run_settings(cfg, factory, prompts, progress=progress)
    vocab_hi = int(model.get_output_embeddings().weight.shape[0])
    probe = HFEngine(model, eos_token_id=eos, pad_token_id=pad, device=cfg.device, batching="static")
    contexts = cfg.cost_contexts or (64, cfg.max_len // 2, cfg.max_len + 64)
    curve = measure_cost_curve(model, device=cfg.device, rows=cfg.cost_rows, contexts=contexts,
                               iters=cfg.cost_iters, vocab_hi=vocab_hi, seed=cfg.seed, progress=progress)
    pcurve = measure_prefill_curve(model, device=cfg.device, vocab_hi=vocab_hi, seed=cfg.seed, progress=progress,
                                   shapes=[(8, 32), (32, 64), (32, 256), (64, 128)])
    tokens = sum(p["tokens"] for p in pcurve)
    prompt_lens = [len(p.prompt_ids) for p in prompts[: cfg.prompts * 64]]
    config = asdict(cfg)
    config.update({
        "segments": list(cfg.segments), "regimes": list(cfg.regimes),
        "cost_rows": list(cfg.cost_rows), "cost_contexts": list(contexts),
        "warmup_steps": {str(s): (s if cfg.warmup is None else cfg.warmup) for s in cfg.segments},
        # names the simulator reads
        "max_response_len": cfg.max_len, "prompts_per_step": cfg.prompts, "group_size": cfg.group,
        "prompt_len_mean": sum(prompt_lens) / len(prompt_lens), "min_ready_groups": 1,
        "engine": "hf", "engine_backend": probe.backend, "share_min_tokens": probe.share_min_tokens,
        "max_batch_rows": probe.max_batch_rows,
        "threads_used": torch.get_num_threads(), "torch": torch.__version__,
        "python": _platform.python_version(), "cpu_count": os.cpu_count(),
        "loadavg_start": list(load_start) if load_start else None,
        "loadavg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "wall_s": time.perf_counter() - t_start,
        "policy_version": 0, "training": False,
    })
    return {
        "config": config,
        "results": results,
        "cost_curve": curve,
        "prefill_curve": pcurve,
        "prefill_ms_per_token": sum(p["ms"] for p in pcurve) / tokens if tokens else None,
        "lengths": lengths,
        "group_lengths": groups,
        **prefix,
    }


# ----------------------------------------------------------------------------- text report


def format_report(out: dict[str, Any]) -> str:
    """Human-readable tables of a ``run_rollout_bench`` result."""
    cfg = out["config"]
    lines = [
        f"ulorl-bench rollout — model {cfg.get('model')} on {cfg.get('device')}, "
        f"{cfg.get('threads_used')} threads, no training (fixed policy)",
        f"  {cfg['prompts']} prompts x {cfg['group']} per step, global max {cfg['max_len']} tokens, "
        f"segments {cfg['segments']}, regimes {cfg['regimes']}",
        f"  {cfg['steps']} measured steps per setting (same prompts for all; target {cfg['seconds']:.0f}s) "
        f"over {cfg['rounds']} round-robin rounds, "
        f"warm-up {cfg.get('warmup_steps')} steps; load average start {cfg.get('loadavg_start')} "
        f"end {cfg.get('loadavg_end')}",
        "",
    ]
    hdr = (f"{'S':>3} {'step s':>8} {'fin/s':>8} {'+-se':>6} {'tok/s':>8} {'util':>6} {'prefill':>8} {'rows':>7} "
           f"{'unfin':>7} {'it/fin':>7} {'pf tok/fin':>10} {'ratio':>6}")
    for regime in cfg["regimes"]:
        lines.append(f"regime {regime}:")
        lines.append(hdr)
        for r in out["results"]:
            if r["regime"] != regime:
                continue
            lines.append(
                f"{r['segments']:>3} {_f(r['step_time_s'], 3):>8} {_f(r['finished_per_s'], 2):>8} "
                f"{_f(r.get('finished_per_s_se'), 2):>6} "
                f"{_f(r['tokens_per_s'], 0):>8} {_f(r['decode_utilization'], 3):>6} "
                f"{_pct(r['prefill_frac']):>8} {_f(r['mean_rows'], 1):>7} {_f(r['mean_unfinished'], 1):>7} "
                f"{_f(r['iters_per_finished'], 3):>7} {_f(r['prefill_tokens_per_finished'], 1):>10} "
                f"{_f(r['ratio_vs_s1'], 2):>6}")
        lines.append("")
    curve = out.get("cost_curve") or []
    if curve:
        ctxs = sorted({p["context"] for p in curve})
        rows = sorted({p["rows"] for p in curve})
        at = {(p["rows"], p["context"]): p["ms_per_iter"] for p in curve}
        lines.append("decode forward cost (ms per iteration) vs active rows (down) and context (across):")
        lines.append(f"{'rows':>6} " + " ".join(f"{c:>8}" for c in ctxs))
        for r in rows:
            lines.append(f"{r:>6} " + " ".join(f"{_f(at.get((r, c)), 2):>8}" for c in ctxs))
        lines.append("")
    if out.get("prefill_ms_per_token") is not None:
        lines.append(f"prefill: {out['prefill_ms_per_token']:.4f} ms per token "
                     f"({', '.join(str(p['rows']) + 'x' + str(p['context']) for p in out.get('prefill_curve', []))})")
    recs = out.get("group_prefix") or []
    if recs:
        lc = [x for r in recs for x in r["lcp"]]
        lines.append(f"prefix records: {len(recs)} groups over {len(out.get('prefix_prompts') or [])} prompts, "
                     f"mean common prefix of neighbouring responses {sum(lc) / max(1, len(lc)):.1f} tokens")
    lens = out.get("lengths") or []
    if lens:
        srt = sorted(lens)
        mx = cfg["max_len"]
        lines.append(f"response lengths ({len(lens)} finished): mean {sum(lens) / len(lens):.1f}, "
                     f"median {srt[len(srt) // 2]}, p90 {srt[int(0.9 * (len(srt) - 1))]}, max {srt[-1]}, "
                     f"truncated at {mx}: {sum(1 for x in lens if x >= mx) / len(lens):.1%}, "
                     f"mean/max {sum(lens) / len(lens) / mx:.3f}")
    return "\n".join(lines)


def _f(x: Optional[float], nd: int) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def run_engine_comparison(cfg: BenchConfig, engines: Sequence[str], *, progress: Progress = None) -> dict[str, Any]:
    """``ulorl-bench rollout --engine hf,vllm``: the same prompts, seeds and segment count
    (``cfg.segments[0]``, compact batching) on each engine in turn (one engine alive at a time),
    after one warm-up step each; tokens/s and finished samples/s of the measured steps."""
    import torch

    from ulorl.models.loading import load_policy, resolve_model_path
    from ulorl.rollout.engines.hf import HFEngine

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = load_policy(cfg.model, device=cfg.device)
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    prompts = embedded_prompts(tok, max(512, cfg.prompts * 16), cfg.seed)
    longest = max(len(p.prompt_ids) for p in prompts)
    steps = cfg.steps or 4
    S = cfg.segments[0]
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed)
    rows: list[dict[str, Any]] = []
    for name in engines:
        if name == "hf":
            eng: Engine = HFEngine(model, eos_token_id=eos, pad_token_id=pad, device=cfg.device, batching="compact")
        elif name == "vllm":
            from ulorl.rollout.engines.vllm import VLLMEngine

            eng = VLLMEngine(resolve_model_path(cfg.model), eos_token_id=eos, dtype="float32",
                             max_model_len=longest + cfg.max_len + 8, seed=cfg.seed)
        else:
            raise ValueError(f"--engine: unknown engine {name!r} (hf, vllm)")
        try:
            sched = SegmentScheduler(eng, segments=S, max_response_len=cfg.max_len, group_size=cfg.group,
                                     prompts_per_step=cfg.prompts, sampling=sampling, seed=cfg.seed)
            it = _cycle(prompts)
            sched.step([next(it) for _ in range(sched.prompts_wanted())], 0)          # warm-up
            tokens = finished = 0
            wall = 0.0
            for _ in range(steps):
                new = [next(it) for _ in range(sched.prompts_wanted())]
                t0 = time.perf_counter()
                res = sched.step(new, 0)
                wall += time.perf_counter() - t0
                tokens += res.decoded_tokens
                finished += res.finished + res.truncated
            rows.append({"engine": name, "steps": steps, "wall_s": wall, "tokens": tokens, "completed": finished,
                         "tokens_per_s": tokens / wall, "completed_per_s": finished / wall})
            _say(progress, f"{name}: {tokens / wall:.0f} tok/s, {finished / wall:.2f} completed/s over {steps} steps")
        finally:
            eng.close()
    return {"engines": rows, "segments": S, "prompts": cfg.prompts, "group": cfg.group, "max_len": cfg.max_len,
            "model": cfg.model, "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None}


def format_engine_comparison(out: dict[str, Any]) -> str:
    lines = [f"engines side by side: S={out['segments']}, {out['prompts']} prompts x {out['group']}, "
             f"max {out['max_len']} tokens, model {out['model']}",
             f"{'engine':<7} {'steps':>5} {'wall s':>8} {'tokens':>8} {'tok/s':>8} {'completed/s':>12}"]
    for r in out["engines"]:
        lines.append(f"{r['engine']:<7} {r['steps']:>5} {r['wall_s']:>8.1f} {r['tokens']:>8} {r['tokens_per_s']:>8.0f} "
                     f"{r['completed_per_s']:>12.2f}")
    return "\n".join(lines)
