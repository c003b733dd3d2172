"""The default rollout engine: a transformers causal LM with a hand-written KV-cache decode loop.

    engine = HFEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      batching="compact")
    results = engine.generate(requests, SamplingParams(temperature=0.85))
    engine.update_weights(trainer_model.state_dict(), version=3)

One ``generate`` call decodes every request in one batch (or ``max_batch_rows`` at a time):

1. **Prefill.** Contexts ``prompt_ids + prefix_ids`` are re-prefilled under the current weights
   at every call (nothing is reused across calls, so a weight update can never leak stale keys).
   Within a call, shared prefixes are prefilled once: the distinct contexts form a prefix forest
   (``prefix_forest``, torch-free in ``ulorl.rollout.prefix``; the G new samples of a prompt are
   one context, continuations of one prompt share the prompt and any common response prefix),
   pruned to the shares that pay (``share_plan``), prefilled level by level after their parent's
   keys/values. Matmuls run on the real tokens only (packed); attention on length-sorted,
   little-padded chunks.
2. **Buckets.** Rows are grouped by context length into a few buckets; each bucket owns a
   PREALLOCATED cache ``[L, 2, rows, kv_heads, width, head_dim]`` whose width is its own longest
   context plus the decode budget, and attention runs per bucket — a short new prompt never pays
   for the long context of a carried-over continuation in the same batch (ragged attention).
   Left padding inside a bucket is masked; positions are per row.
3. **Decode loop** (one token per row per iteration), in one of two regimes:
   - ``static``: a row keeps its slot until every row of the batch is done (EOS or budget), so an
     iteration costs the same however many rows finished — synchronous RL on a GPU;
   - ``compact``: finished rows leave the batch: once at least ``compact_min_frac`` of the rows
     are done, the caches are rebuilt for the surviving rows (copying only the columns written
     so far) under the bucket plan that is best for them.

Sampling (``sampling.py``): temperature / top-k / top-p / greedy, one counter-based uniform per
(request seed, response position), so results do not depend on batch composition or regime.
Returned log-probs are ``log_softmax(logits / T)`` of the sampled tokens, before truncation.

Llama-family models (Qwen3, Qwen2, Llama) run on ``FastCausalLM`` (packed weights, no module
dispatch; checked against ``model(...)`` at construction). Other models run the model's own
forward with a transformers ``DynamicCache`` (same sampling, regimes and stats; slower).

MoE models (a config with ``num_experts`` and ``num_experts_per_tok``: Qwen3-MoE) run the model's own
forward with ``output_router_logits``; every result carries ``routed_experts``: per response token the
top-k experts of each layer in the forward that produced its logits (the prefill's last context
position for token 0, the previous token's decode step after), Int[tokens, layers, top_k] uint8 / int16
(``ulorl.rollout.routes``), the routing the trainer replays (``algo.routing_replay: r3``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional, Protocol

import torch

from ulorl.algo.routing import own_routes
from ulorl.rollout.buckets import plan_buckets  # noqa: F401  (re-exported; torch-free, shared with the simulator)
from ulorl.rollout.engines.fastlm import Bucket, FastCausalLM, unsupported_reason
from ulorl.rollout.engines.sampling import combine_seed, counter_uniforms, sample_tokens
from ulorl.rollout.prefix import PrefixNode, prefix_forest, share_plan  # noqa: F401  (re-exported)
from ulorl.rollout.routes import compact_routes
from ulorl.rollout.types import (
    EngineBase,
    EngineStats,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    check_sampling,
    request_context,
)

log = logging.getLogger(__name__)

Batching = Literal["static", "compact"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class HFEngineStats(EngineStats):
    """``EngineStats`` plus what the HF engine can say about one ``generate`` call.

    ``context_tokens``: prompt + prefix tokens of all requests (what a naive engine prefills);
    ``prefill_tokens``: tokens actually forwarded in prefill (after sharing identical contexts);
    ``prefill_padded``: prefill tokens including padding; ``compactions``: cache shrinks;
    ``buckets``: context buckets of the (first) batch; ``batches``: sequential batches;
    ``forwards``: decode forward passes. ``decode_iterations`` counts token rounds (the first
    token of a batch comes from the prefill logits), so ``row_slots == rows * decode_iterations``
    in the static regime; ``decode_s / forwards`` is the cost of one decode forward.
    """

    context_tokens: int = 0
    forwards: int = 0
    prefill_padded: int = 0
    compactions: int = 0
    buckets: int = 0
    batches: int = 0


@dataclass
class _Row:
    index: int            # position in the request list
    ctx: list[int]
    max_new: int
    seed: int
    start_pos: int        # response position of the first new token (= len(prefix))


class HFEngine(EngineBase):
    """Engine protocol implementation over a transformers causal LM (module docstring).

    Args:
        model: a transformers ``*ForCausalLM`` (its weights are read, not modified; the fallback
            path moves it to ``device``).
        eos_token_id: EOS id (or a list of ids; the first is reported as ``eos_token_id``).
        pad_token_id: id used for padding (any id works; padded positions are masked).
        device: ``"cpu"``, ``"cuda"``, ...
        batching: ``"compact"`` (default) or ``"static"`` (see module docstring).
        max_batch_rows: decode at most this many rows at once (None = all requests in one batch).
        dtype: compute dtype (``torch.dtype`` or ``"float32"`` / ``"bfloat16"`` / ``"float16"``);
            None = the model's.
        backend: ``"auto"`` (fast path when supported and verified), ``"fast"`` or ``"hf"``.
        max_buckets / bucket_overhead: context-bucket planning (``plan_buckets``).
        compact_min_frac: compact when at least this fraction of the batch rows are done.
        prefill_chunk_tokens: padded-token budget of one prefill forward.
        share_min_tokens: share a common prefix of several contexts (prefill it once) only when
            that saves at least this many prefill tokens (``share_plan``).
    """

    def __init__(
        self,
        model,
        eos_token_id: int | Sequence[int],
        pad_token_id: Optional[int],
        *,
        device: str | torch.device = "cpu",
        batching: Batching = "compact",
        max_batch_rows: Optional[int] = None,
        dtype: Optional[torch.dtype | str] = None,
        backend: Literal["auto", "fast", "hf"] = "auto",
        max_buckets: int = 4,
        bucket_overhead: float = 256.0,
        compact_min_frac: float = 0.125,
        prefill_chunk_tokens: int = 8192,
        share_min_tokens: int = 64,
    ) -> None:
        if batching not in ("static", "compact"):
            raise ValueError(f"batching must be 'static' or 'compact', got {batching!r}")
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1 or None, got {max_batch_rows}")
        if backend not in ("auto", "fast", "hf"):
            raise ValueError(f"backend must be 'auto', 'fast' or 'hf', got {backend!r}")
        if not 0.0 < compact_min_frac <= 1.0:
            raise ValueError(f"compact_min_frac must be in (0, 1], got {compact_min_frac}")
        eos_list = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(e) for e in eos_token_id]
        if not eos_list:
            raise ValueError("eos_token_id must name at least one token")
        self.eos_token_id: int = eos_list[0]
        self.eos_token_ids: list[int] = eos_list
        self.pad_token_id: int = int(pad_token_id if pad_token_id is not None else eos_list[0])
        self.policy_version: int = 0
        self.batching: Batching = batching
        self.max_batch_rows = max_batch_rows
        self.max_buckets = max_buckets
        self.bucket_overhead = bucket_overhead
        self.compact_min_frac = compact_min_frac
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.share_min_tokens = share_min_tokens
        self.rebucket = True   # compaction re-plans the buckets for the surviving rows (False: keeps them)
        self.device = torch.device(device)
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
            dtype = _DTYPES[dtype]
        self.model = model
        self.dtype: torch.dtype = dtype or next(model.parameters()).dtype
        self.last_stats: HFEngineStats = HFEngineStats()
        self._eos = torch.tensor(eos_list, dtype=torch.long, device=self.device)
        self.fast: Optional[FastCausalLM] = None
        reason = unsupported_reason(model)
        if backend == "fast" and reason:
            raise ValueError(f"backend='fast' unsupported for this model: {reason}")
        if backend != "hf" and reason is None:
            try:
                fast = FastCausalLM(model, self.device, self.dtype)
                fast.verify()
                self.fast = fast
            except Exception as exc:  # noqa: BLE001 - any mismatch means: use the model's forward
                if backend == "fast":
                    raise
                log.warning("HFEngine: fast path disabled (%s); using the model's forward", exc)
        elif backend == "auto":
            log.info("HFEngine: fast path unsupported (%s); using the model's forward", reason)
        if self.fast is None:
            self.model.to(self.device)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        cfg = getattr(model, "config", None)
        self.moe_top_k: int = int(getattr(cfg, "num_experts_per_tok", 0) or 0) if getattr(cfg, "num_experts", 0) else 0
        self.num_experts: int = int(getattr(cfg, "num_experts", 0) or 0)
        if self.moe_top_k and self.fast is not None:   # the packed path has no router: record on the model's forward
            self.fast = None
            self.model.to(self.device)
        # MoE: each router's logits of a decode forward, caught by a hook that only records while the engine
        # decodes (the model may be the trainer's own module)
        self._router_logits: Optional[list[torch.Tensor]] = None
        if self.moe_top_k:
            for mod in model.modules():
                if type(mod).__name__.endswith("Router") and hasattr(mod, "top_k"):
                    mod.register_forward_hook(self._catch_router)

    def _catch_router(self, _module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if self._router_logits is not None:
            self._router_logits.append((output[0] if isinstance(output, tuple) else output).detach())

    @property
    def backend(self) -> str:
        return "fast" if self.fast is not None else "hf"

    # ------------------------------------------------------------------------------ weights
    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load ``state_dict`` into the model (skipped when it already is the model's own tensors)
        and repack the fast-path weights. Nothing computed under old weights survives a call."""
        own = self.model.state_dict()
        same = set(state_dict) == set(own) and all(
            state_dict[k].data_ptr() == own[k].data_ptr() for k in own)
        if not same:
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            tied = {k for k in missing if k.endswith("lm_head.weight")}
            bad_missing = [k for k in missing if k not in tied]
            if bad_missing or unexpected:
                raise KeyError(f"update_weights: missing {bad_missing[:5]}, unexpected {list(unexpected)[:5]}")
        if self.fast is not None:
            self.fast.pack()
        self.policy_version = int(version)

    # ------------------------------------------------------------------------------ generate
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        """Decode each request (results in request order); see the module docstring."""
        stats = HFEngineStats()
        check_sampling(sampling)
        results: list[Optional[GenerationResult]] = [None] * len(requests)
        rows: list[_Row] = []
        for i, r in enumerate(requests):
            ctx = request_context(r, self.max_model_len)
            stats.context_tokens += len(ctx)
            if r.max_new_tokens == 0:
                results[i] = GenerationResult(r.request_id, [], [], "length")
                continue
            rows.append(_Row(i, ctx, int(r.max_new_tokens), combine_seed(sampling.seed, int(r.seed)),
                             len(r.prefix_ids)))
        rows.sort(key=lambda row: len(row.ctx))
        cap = self.max_batch_rows or max(1, len(rows))
        was_training = self.model.training
        if self.fast is None:
            self.model.eval()  # the model's own forward: no dropout while decoding
        # the model's own forward computes in ``dtype`` under autocast when it differs from the weights' (the fast
        # path packs its weights in it instead): a bf16 engine against a float32 trainer, MoE routers included
        model_dtype = next(self.model.parameters()).dtype
        cast = (torch.autocast(self.device.type, dtype=self.dtype) if self.fast is None and self.dtype != model_dtype
                else contextlib.nullcontext())
        try:
            with torch.inference_mode(), cast:
                for b0 in range(0, len(rows), cap):
                    batch = rows[b0:b0 + cap]
                    out = self._run_batch(batch, sampling, stats)
                    for row, (toks, lps, reason, routes) in zip(batch, out):
                        req = requests[row.index]
                        results[row.index] = GenerationResult(req.request_id, toks, lps, reason, routes)
                    stats.batches += 1
        finally:
            self.model.train(was_training)
            self._router_logits = None
        stats.useful_tokens = sum(len(r.token_ids) for r in results if r is not None)
        self.last_stats = stats
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------------------ one batch
    def _run_batch(self, rows: list[_Row], sampling: SamplingParams, stats: HFEngineStats
                   ) -> list[tuple[list[int], list[float], Literal["eos", "length"], Optional[Any]]]:
        """Prefill + decode loop for rows sorted by context length; per row (tokens, log-probs, finish
        reason, routed experts Int[tokens, layers, k] or None for a dense model)."""
        dev = self.device
        num_rows = len(rows)
        max_new_longest = max(r.max_new for r in rows)
        t0 = time.perf_counter()
        state: DecodeState = (_FastState(self, rows, max_new_longest, stats) if self.fast is not None
                              else _HFState(self, rows, max_new_longest, stats))
        logits = state.first_logits                                   # [N, V]
        greedy = sampling.greedy
        uniforms = None                                               # [N, max_new_longest] draws
        if not greedy:
            uniforms = torch.from_numpy(counter_uniforms([r.seed for r in rows], [r.start_pos for r in rows],
                                                         max_new_longest)).to(dev)
        batch_to_row = torch.arange(num_rows, device=dev)             # batch position -> request row
        budget_per_row = torch.tensor([r.max_new for r in rows], dtype=torch.long, device=dev)
        budget = budget_per_row                                       # of the rows still in the batch
        same_budget = all(r.max_new == max_new_longest for r in rows)  # then only the last round hits it
        first_eos = self.eos_token_ids[0]
        single_eos = len(self.eos_token_ids) == 1

        def is_eos(t: torch.Tensor) -> torch.Tensor:
            return t == first_eos if single_eos else torch.isin(t, self._eos)

        tokens, logprobs = sample_tokens(logits, sampling, None if uniforms is None else uniforms[:, 0])
        rounds = [(batch_to_row, tokens, logprobs)]   # per decode round: (request rows, tokens, log-probs)
        route_rounds = [state.routes] if state.routes is not None else []  # [rows, layers, k]
        done = is_eos(tokens) | (budget <= 1)
        stats.row_slots += num_rows
        stats.decode_iterations += 1
        stats.batch_rows += num_rows
        stats.prefill_s += time.perf_counter() - t0

        t1 = time.perf_counter()
        compact = self.batching == "compact"
        batch_size = num_rows
        for iteration in range(1, max_new_longest):
            num_done = int(done.sum())
            if num_done == batch_size:
                break
            if compact and num_done >= max(1, math.ceil(self.compact_min_frac * batch_size)):
                keep = (~done).nonzero().squeeze(1)
                state.compact(keep, iteration)
                tokens, batch_to_row, budget, done = tokens[keep], batch_to_row[keep], budget[keep], done[keep]
                batch_size = int(keep.shape[0])
                stats.compactions += 1
            logits = state.step(tokens, iteration)
            tokens, logprobs = sample_tokens(logits, sampling,
                                             None if uniforms is None else uniforms[batch_to_row, iteration])
            rounds.append((batch_to_row, tokens, logprobs))
            if route_rounds and state.routes is not None:
                route_rounds.append(state.routes)
            done = done | is_eos(tokens)
            if not same_budget:
                done = done | (budget <= iteration + 1)
            stats.decode_iterations += 1
            stats.forwards += 1
            stats.row_slots += batch_size
        stats.decode_s += time.perf_counter() - t1

        # assemble [N, max_new_longest] outputs (one copy per run of rounds between compactions)
        out_tokens = torch.full((num_rows, max_new_longest), self.pad_token_id, dtype=torch.long, device=dev)
        out_logprobs = torch.zeros((num_rows, max_new_longest), dtype=torch.float32, device=dev)
        run_start = 0
        while run_start < len(rounds):
            request_rows = rounds[run_start][0]
            run_end = run_start
            while run_end < len(rounds) and rounds[run_end][0] is request_rows:
                run_end += 1
            run = rounds[run_start:run_end]
            out_tokens[request_rows, run_start:run_end] = torch.stack([r[1] for r in run], dim=1)
            out_logprobs[request_rows, run_start:run_end] = torch.stack([r[2] for r in run], dim=1)
            run_start = run_end
        # a response ends at its first EOS within its budget (rows never leave before their end)
        within = torch.arange(max_new_longest, device=dev)[None] < budget_per_row[:, None]
        eos_hits = is_eos(out_tokens) & within
        ended_eos = eos_hits.any(dim=1)
        lengths = torch.where(ended_eos, eos_hits.int().argmax(dim=1) + 1, budget_per_row).tolist()
        toks_all, lps_all, eos_all = out_tokens.tolist(), out_logprobs.tolist(), ended_eos.tolist()
        routes_all = self._assemble_routes(rounds, route_rounds, num_rows, max_new_longest)
        return [(toks_all[i][:lengths[i]], lps_all[i][:lengths[i]], "eos" if eos_all[i] else "length",
                 None if routes_all is None else compact_routes(routes_all[i, :lengths[i]], self.num_experts))
                for i in range(num_rows)]

    @staticmethod
    def _assemble_routes(rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                         route_rounds: list[torch.Tensor], num_rows: int, width: int) -> Optional[Any]:
        """Int64[N, width, layers, k] numpy of the per-round routes (rows placed as ``rounds`` say), or None."""
        if not route_rounds:
            return None
        layers, k = route_rounds[0].shape[1:]
        out = torch.zeros((num_rows, width, layers, k), dtype=torch.long)
        for j, ((request_rows, _, _), r) in enumerate(zip(rounds, route_rounds)):
            out[request_rows.cpu(), j] = r.cpu()
        return out.numpy()


class DecodeState(Protocol):
    """The caches of one batch during the decode loop (``_FastState`` or ``_HFState``).

    Built by prefilling the batch's rows (sorted by context length). Response token 0 comes
    from ``first_logits``; token j >= 1 from ``step(tokens, j)``, which feeds token j - 1 of every
    row still in the batch. ``compact(keep, j)`` drops every other row before step j.
    """

    first_logits: torch.Tensor  # Float[N, V]: logits of response token 0 of every row
    routes: Optional[torch.Tensor]  # MoE: Long[B, layers, k], experts of the last forward's last position

    def step(self, tokens: torch.Tensor, iteration: int) -> torch.Tensor:
        """Feed ``tokens`` Long[B] (token ``iteration - 1`` of each row in the batch) -> Float[B, V]."""
        ...

    def compact(self, keep: torch.Tensor, iteration: int) -> None:
        """Keep only batch rows ``keep`` (Long[B'], ascending) from decode step ``iteration`` on."""
        ...


def _prefill_forest(fast: FastCausalLM, contexts: list[list[int]], pad_id: int, budget: int,
                    stats: HFEngineStats, min_saving: int = 64) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Prefill distinct ``contexts`` through their prefix forest, level by level, in chunks of at
    most ``budget`` padded (past + new) tokens. Returns per context its keys/values
    ``[L, 2, kvh, len, hd]`` and last-position logits ``[V]``."""
    dev = fast.device
    nodes = share_plan(prefix_forest(contexts), len(contexts), min_saving)
    levels: dict[int, list[int]] = {}
    for nid, nd in enumerate(nodes):
        levels.setdefault(nd.level, []).append(nid)
    has_children = {nd.parent for nd in nodes}
    full: dict[int, torch.Tensor] = {}
    leaf_kv: list[Optional[torch.Tensor]] = [None] * len(contexts)
    logits: list[Optional[torch.Tensor]] = [None] * len(contexts)
    L, kvh, hd = fast.nlayers, fast.kvh, fast.hd
    for lvl in sorted(levels):
        todo = sorted(levels[lvl], key=lambda x: (nodes[x].end - nodes[x].start, nodes[x].start))
        c0 = 0
        while c0 < len(todo):
            c1 = c0 + 1
            pm, qm = nodes[todo[c0]].start, nodes[todo[c0]].end - nodes[todo[c0]].start
            qsum = qm
            while c1 < len(todo):
                nd = nodes[todo[c1]]
                q = nd.end - nd.start
                p2, q2 = max(pm, nd.start), max(qm, q)
                n2 = c1 - c0 + 1
                # token budget (past + new, padded), and at most ~25% padding of the new tokens
                if n2 * (p2 + q2) > budget or n2 * q2 > 1.25 * (qsum + q) + 32:
                    break
                pm, qm, qsum, c1 = p2, q2, qsum + q, c1 + 1
            chunk = todo[c0:c1]
            n = len(chunk)
            ids = torch.full((n, qm), pad_id, dtype=torch.long)
            qlens = []
            for i, nid in enumerate(chunk):
                nd = nodes[nid]
                ids[i, : nd.end - nd.start] = torch.tensor(contexts[nd.rep][nd.start:nd.end], dtype=torch.long)
                qlens.append(nd.end - nd.start)
            past = plens = None
            if pm > 0:
                past = torch.zeros(L, 2, n, kvh, pm, hd, dtype=fast.dtype, device=dev)
                for i, nid in enumerate(chunk):
                    p = nodes[nid].start
                    if p:
                        past[:, :, i, :, pm - p:] = full[nodes[nid].parent]
                plens = torch.tensor([nodes[nid].start for nid in chunk], dtype=torch.long, device=dev)
            kv_new, lg = fast.prefill(ids.to(dev), torch.tensor(qlens, dtype=torch.long, device=dev), past, plens)
            stats.prefill_tokens += sum(qlens)
            stats.prefill_padded += n * qm
            for i, nid in enumerate(chunk):
                nd = nodes[nid]
                own = kv_new[:, :, i, :, : qlens[i]]
                path = own if nd.start == 0 else torch.cat([full[nd.parent], own], dim=3)
                if nid in has_children:
                    full[nid] = path
                for u in nd.ends:
                    leaf_kv[u] = path
                    logits[u] = lg[i]
            c0 = c1
        for nid in levels.get(lvl - 1, []):
            full.pop(nid, None)
    return leaf_kv, logits  # type: ignore[return-value]


class _FastState:
    """Prefill into bucketed preallocated caches, then one ``FastCausalLM.decode`` per step."""

    def __init__(self, eng: HFEngine, rows: list[_Row], max_new_longest: int, stats: HFEngineStats) -> None:
        fast = eng.fast
        assert fast is not None
        self.fast = fast
        self.routes: Optional[torch.Tensor] = None   # dense models only: no routing
        dev = eng.device
        N = len(rows)
        lens = [len(r.ctx) for r in rows]
        self.ctx = lens                                                   # context length per batch row
        self.max_new_longest = max_new_longest
        self.max_buckets, self.overhead = eng.max_buckets, eng.bucket_overhead
        self.rebucket = eng.rebucket
        self.pos = torch.tensor(lens, dtype=torch.long, device=dev)      # position of token 0
        plan = plan_buckets(lens, max_new_longest, eng.max_buckets, eng.bucket_overhead)
        stats.buckets = stats.buckets or len(plan)
        L, kvh, hd = fast.nlayers, fast.kvh, fast.hd
        self.buckets: list[Bucket] = []
        row_bucket = [0] * N
        for bi, (s, e) in enumerate(plan):
            P = lens[e - 1]
            W = P + max_new_longest
            kv = torch.empty(L, 2, e - s, kvh, W, hd, dtype=fast.dtype, device=dev)
            kv[..., :P, :].zero_()
            starts = torch.tensor([P - lens[i] for i in range(s, e)], dtype=torch.long, device=dev)
            mask = None
            if bool((starts > 0).any()):
                mask = (torch.arange(W, device=dev)[None] >= starts[:, None])[:, None, None, :]
            self.buckets.append(Bucket(kv=kv, mask=mask, context_width=P, start=s, num_rows=e - s))
            for i in range(s, e):
                row_bucket[i] = bi

        # distinct contexts -> prefix forest; every node's tokens are prefilled once, level by level
        uid_of: dict[tuple[int, ...], int] = {}
        row_uid = []
        uniq: list[list[int]] = []
        for r in rows:
            key = tuple(r.ctx)
            u = uid_of.get(key)
            if u is None:
                u = uid_of[key] = len(uniq)
                uniq.append(r.ctx)
            row_uid.append(u)
        leaf_kv, logits_u = _prefill_forest(fast, uniq, eng.pad_token_id, eng.prefill_chunk_tokens, stats,
                                            eng.share_min_tokens)
        # copy each context's keys/values, right-aligned, into the cache rows of its requests
        targets: dict[tuple[int, int], list[int]] = {}
        for i, u in enumerate(row_uid):
            bi = row_bucket[i]
            targets.setdefault((bi, u), []).append(i - self.buckets[bi].start)
        for (bi, u), local in targets.items():
            b = self.buckets[bi]
            c = len(uniq[u])
            src = leaf_kv[u]                                          # [L, 2, kvh, c, hd]
            if len(local) == 1:
                b.kv[:, :, local[0], :, b.context_width - c:b.context_width] = src
            else:
                idx = torch.tensor(local, dtype=torch.long, device=dev)
                b.kv[:, :, idx, :, b.context_width - c:b.context_width] = src[:, :, None]
        self.first_logits = torch.stack([logits_u[u] for u in row_uid])

    def step(self, tokens: torch.Tensor, iteration: int) -> torch.Tensor:
        return self.fast.decode(tokens, self.pos + (iteration - 1), self.buckets, iteration)

    def compact(self, keep: torch.Tensor, iteration: int) -> None:
        """Keep batch rows ``keep`` (sorted) before decode step ``iteration``; the caches are rebuilt for the
        bucket plan that is best for the surviving rows (a tail of a few long rows ends in one
        bucket), copying only the columns written so far, shifted to the new bucket's alignment."""
        keep_list = keep.tolist()
        ctx = [self.ctx[i] for i in keep_list]                  # sorted ascending, like the batch
        if self.rebucket:
            plan = plan_buckets(ctx, self.max_new_longest - iteration, self.max_buckets, self.overhead)
        else:                                                   # keep the old buckets (minus rows)
            plan, r = [], 0
            for b in self.buckets:
                n = sum(1 for i in keep_list if b.start <= i < b.start + b.num_rows)
                if n:
                    plan.append((r, r + n))
                    r += n
        # old bucket of each surviving row and its index there
        old_of: list[tuple[int, int]] = []
        bi = 0
        for i in keep_list:
            while i >= self.buckets[bi].start + self.buckets[bi].num_rows:
                bi += 1
            old_of.append((bi, i - self.buckets[bi].start))
        written = iteration - 1                                          # decoded tokens already in the cache
        L, kvh, hd = self.fast.nlayers, self.fast.kvh, self.fast.hd
        dev, dt = self.pos.device, self.fast.dtype
        new_buckets: list[Bucket] = []
        for s, e in plan:
            P = ctx[e - 1]
            W = P + self.max_new_longest
            kv = torch.empty(L, 2, e - s, kvh, W, hd, dtype=dt, device=dev)
            r = s
            while r < e:                                         # runs of rows from one old bucket
                ob = old_of[r][0]
                r2 = r
                while r2 < e and old_of[r2][0] == ob:
                    r2 += 1
                old = self.buckets[ob]
                # row data sits at [P_old - c, P_old + written) -> [P - c, P + written); c <= P
                shift = P - old.context_width
                lo = max(0, -shift)
                src = [old_of[x][1] for x in range(r, r2)]
                if src == list(range(src[0], src[0] + len(src))):
                    block = old.kv[:, :, src[0]:src[0] + len(src), :, lo: old.context_width + written]
                else:
                    src_rows = torch.tensor(src, dtype=torch.long, device=dev)
                    block = old.kv[:, :, src_rows, :, lo: old.context_width + written]
                kv[:, :, r - s:r2 - s, :, lo + shift: P + written] = block
                if shift > 0:
                    kv[:, :, r - s:r2 - s, :, :shift].zero_()
                r = r2
            starts = torch.tensor([P - c for c in ctx[s:e]], dtype=torch.long, device=dev)
            mask = None
            if bool((starts > 0).any()):
                mask = (torch.arange(W, device=dev)[None] >= starts[:, None])[:, None, None, :]
            new_buckets.append(Bucket(kv=kv, mask=mask, context_width=P, start=s, num_rows=e - s))
        self.buckets = new_buckets
        self.ctx = ctx
        self.pos = self.pos[keep]


class _HFState:
    """Fallback: the model's own forward with a transformers ``DynamicCache`` (one left-padded batch)."""

    def __init__(self, eng: HFEngine, rows: list[_Row], max_new_longest: int, stats: HFEngineStats) -> None:
        from transformers import DynamicCache

        self.model = eng.model
        dev = eng.device
        lens = [len(r.ctx) for r in rows]
        P = max(lens)
        N = len(rows)
        ids = torch.full((N, P), eng.pad_token_id, dtype=torch.long)
        mask = torch.zeros((N, P + max_new_longest), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, P - len(r.ctx):] = torch.tensor(r.ctx, dtype=torch.long)
            mask[i, P - len(r.ctx):] = 1
        self.mask = mask.to(dev)
        self.context_width = P
        self.pos = torch.tensor(lens, dtype=torch.long, device=dev)
        try:
            self.cache = DynamicCache(config=self.model.config)
        except TypeError:
            self.cache = DynamicCache()
        import inspect

        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        pos = (self.mask[:, :P].cumsum(-1) - 1).clamp(min=0)
        self.eng = eng
        self.top_k = eng.moe_top_k
        self.routes: Optional[torch.Tensor] = None   # [rows, layers, k]: routes of the last forward's last position
        eng._router_logits = [] if self.top_k else None
        out = self.model(input_ids=ids.to(dev), attention_mask=self.mask[:, :P], position_ids=pos,
                         use_cache=True, **{self.cache_kw: self.cache})
        self.first_logits = out.logits[:, -1].float()
        self._take_routes(N, P)
        stats.prefill_tokens += sum(lens)
        stats.prefill_padded += N * P
        stats.buckets = stats.buckets or 1

    def step(self, tokens: torch.Tensor, iteration: int) -> torch.Tensor:
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask[:, : self.context_width + iteration],
                         position_ids=(self.pos + (iteration - 1))[:, None], use_cache=True,
                         **{self.cache_kw: self.cache})
        self._take_routes(int(tokens.shape[0]), 1)
        return out.logits[:, -1].float()

    def _take_routes(self, rows: int, width: int) -> None:
        """``routes``: each layer's top-k experts at every row's last input position (MoE models only), from
        the router logits the engine's hooks caught during the forward that just ran."""
        logits = self.eng._router_logits
        if not self.top_k or not logits:
            return
        last = [lg.reshape(rows, width, -1)[:, -1] for lg in logits]          # layers x [rows, E]
        self.routes = torch.stack([own_routes(lg, self.top_k) for lg in last], dim=1)
        self.eng._router_logits = []

    def compact(self, keep: torch.Tensor, iteration: int) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        self.pos = self.pos[keep]
