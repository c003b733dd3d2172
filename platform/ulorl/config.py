"""Typed experiment configuration.

An experiment is one YAML file under ``experiments/`` with the sections ``model``, ``data``,
``rollout``, ``algo``, ``train``, ``tracking`` and ``eval``. It is loaded into frozen pydantic
models (unknown keys are errors), dotted overrides (``algo.mpt.tau=0.95``) are applied before
validation, and every error names the file and the full key path::

    cfg = load_experiment("experiments/quickstart.yaml", ["rollout.segments=8"])
    flat = flatten_config(cfg)   # {"rollout.segments": 8, ...} for MLflow params
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ulorl.algo.entropy_control import ENTROPY_CONTROLS
from ulorl.algo.importance import IS_MODES
from ulorl.algo.loss import LOSS_AGG
from ulorl.algo.masks import ENTROPY_SCOPES, MASK_MODES
from ulorl.algo.rollout_correction import ROLLOUT_CORRECTIONS, SEQ_SCOPES
from ulorl.segments import segment_length


def scaled_max_positions(rope_scaling: dict[str, Any]) -> Optional[int]:
    """The context a YaRN ``rope_scaling`` dict gives: ``original_max_position_embeddings x factor``.

    None without both keys. Trainer (``models.loading``) and engine (``rollout.engine_config``) read it.
    """
    orig, factor = rope_scaling.get("original_max_position_embeddings"), rope_scaling.get("factor")
    if orig is None or factor is None:
        return None
    return int(round(float(orig) * float(factor)))


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the file and key path."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @field_validator("*")
    @classmethod
    def _registry_choice(cls, v: Any, info: ValidationInfo) -> Any:
        # fields naming a registry entry carry json_schema_extra={"choices": list(REGISTRY)}
        extra = cls.model_fields[info.field_name].json_schema_extra if info.field_name else None
        choices = extra.get("choices") if isinstance(extra, dict) else None
        if isinstance(choices, list) and v not in choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in choices)}")
        return v


class ModelConfig(_Section):
    """Which policy to train. ``embedded`` is the shipped warm-started tiny Qwen3."""

    name_or_path: str = Field("embedded", description="'embedded', a local path, or a HF id (online only)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype of the policy")
    rope_scaling: Optional[dict[str, Any]] = Field(
        None, description="rope scaling set on the model config, e.g. {rope_type: yarn, factor: 1.5, "
        "original_max_position_embeddings: 95232}; None = the model's own"
    )
    trust_remote_code: bool = Field(False, description="allow the model repository's own Python code (transformers)")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="attention kernel at load; sdpa/flash_attention_2 keep attention memory linear in length"
    )


class TaskConfig(_Section):
    """The embedded synthetic task (running partial sums with a long-tailed number of terms)."""

    seed: int = Field(0, description="seed of the task generator (which problems exist)")
    num_train: int = Field(20000, ge=1, description="problems in the train split")
    num_heldout: int = Field(256, ge=1, description="problems in the held-out split (disjoint from train)")


class DataConfig(_Section):
    """Prompt datasets. ``embedded`` = the synthetic task; else a JSONL path (problem/answer),
    a benchmark name resolved in ``data_dir`` (``aime2025``, ``beyondaime``), or a HF dataset id."""

    train: str = Field("embedded",
                       description="training prompts: 'embedded', a JSONL path, a benchmark name or a HF id")
    heldout: str = Field("embedded", description="held-out prompts for periodic eval (same forms as data.train)")
    data_dir: Optional[str] = Field(None, description="folder with aime2025.jsonl etc.; else $ULORL_DATA_DIR")
    task: TaskConfig = Field(TaskConfig(),
                             description="the embedded synthetic task (used when train/heldout = embedded)")
    shuffle: bool = Field(True, description="shuffle the training prompts (reshuffled each epoch)")
    seed: int = Field(0, description="seed of the prompt order")


class RolloutConfig(_Section):
    """Segment rollout (PAPER.md section 1). Segment length = max_response_len / segments."""

    engine: Literal["hf", "vllm"] = Field(
        "hf", description="rollout engine: 'hf' (transformers, CPU/GPU) or 'vllm' (gpu extra)")
    device: str = Field("cpu", description="torch device of the policy, rollout and training ('cpu', 'cuda', 'cuda:1')")
    segments: int = Field(4, ge=1, description="S: at most S segments of max_response_len/S tokens")
    max_response_len: int = Field(512, ge=1, description="global maximum response length (tokens)")
    prompts_per_step: int = Field(16, ge=1, description="new prompts added to each rollout step")
    group_size: int = Field(8, ge=1, description="G responses per prompt")
    temperature: float = Field(0.85, gt=0, description="sampling temperature; log-probs, entropy and MPTs use it too")
    top_p: float = Field(1.0, gt=0, le=1.0, description="nucleus sampling mass (1.0 = off)")
    top_k: int = Field(-1, ge=-1, description="top-k sampling (-1 = off)")
    batching: Literal["static", "compact"] = Field(
        "compact", description="hf engine: 'static' keeps finished rows until the batch is done, 'compact' drops them"
    )
    min_ready_groups: int = Field(
        1, ge=1, description="update only when this many complete groups wait (mixed-reward groups with "
        "algo.dynamic_sampling_fill)"
    )
    max_staleness: Optional[int] = Field(None, ge=0, description="drop samples older than this many versions")
    max_unfinished: Optional[int] = Field(None, ge=1, description="stop admitting new prompts above this pool size")
    schedule: Literal["sync", "overlap"] = Field(
        "sync", description="'sync': roll out, then update, then push the weights; 'overlap': the engine decodes the "
        "next segment round at version v while the trainer updates on the groups the previous round released "
        "(docs/algorithm.md, 'Overlapped schedule')"
    )
    overlap_staleness: int = Field(1, ge=0, le=1, description="rollout.schedule=overlap: versions between a segment's "
                                   "decoding and its training added by the overlap (0: the synchronous run)")
    seed: int = Field(0, description="seed of the sampling draws (per request and position)")
    # vLLM-only knobs (ignored by the hf engine)
    vllm_gpu_memory_utilization: float = Field(0.85, gt=0, le=1.0,
                                               description="vLLM: fraction of GPU memory it may use")
    vllm_enable_prefix_caching: bool = Field(True, description="vLLM: reuse cached keys/values of shared prefixes")
    # rollout at scale (rollout/weight_sync.py, rollout/engine_config.py)
    weight_sync_bucket_mb: float = Field(
        256.0, gt=0, description="weight sync streams parameters to the engines in buckets of at most this many MiB"
    )
    weight_sync_transport: Literal["auto", "shm", "inline"] = Field(
        "auto", description="vllm, weight_transfer 'stream': how a bucket reaches the engine's workers: 'shm' "
        "(a file in /dev/shm they map), 'inline' (copied into the RPC message), 'auto' (shm when /dev/shm has "
        "room for two buckets of the largest size, else inline; checked when the engine starts)"
    )
    weight_transfer: Literal["stream", "nccl", "ipc"] = Field(
        "stream", description="vllm: 'stream' (buckets over the engine's RPC, CPU and GPU) or vLLM's native "
        "GPU transfer ('nccl' broadcast to engines on other GPUs, 'ipc' for colocated engines)"
    )
    colocate: bool = Field(
        False, description="vllm on GPU: the engine shares the trainer's GPU and sleeps (frees its memory) "
        "during each policy update; refused on CPU"
    )
    tensor_parallel_size: Optional[int] = Field(
        None, ge=1, description="vllm tensor-parallel size; None: resources.gpus_per_engine when > 1, else 1"
    )
    engine_max_model_len: Optional[int] = Field(
        None, ge=1, description="engine context (prompt + response tokens); None: longest prompt + max_response_len"
    )
    engine_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="compute dtype of the rollout engine (hf: its fast path's packed weights; vllm: its dtype); "
        "None: model.dtype. bfloat16 against a float32 trainer reproduces the paper's train / inference mismatch "
        "(mismatch/* metrics, algo.rollout_correction)"
    )

    @property
    def segment_len(self) -> int:
        """Tokens per segment (``ulorl.segments.segment_length``: ``ceil(max_response_len / segments)``)."""
        return segment_length(self.max_response_len, self.segments)

    @model_validator(mode="after")
    def _transport_has_a_use(self) -> RolloutConfig:
        # a setting nothing reads would be logged as if it had shaped the run
        if self.weight_sync_transport != "auto" and (self.engine != "vllm" or self.weight_transfer != "stream"):
            why = ("the hf engine decodes with the trainer's own weights, so nothing is transferred"
                   if self.engine != "vllm" else
                   f"rollout.weight_transfer={self.weight_transfer} moves the weights with vLLM's native transfer, "
                   "not in buckets")
            raise ValueError(
                f"rollout.weight_sync_transport={self.weight_sync_transport} only applies to rollout.engine=vllm with "
                f"rollout.weight_transfer=stream (how a weight bucket reaches vLLM's workers), and here {why}; leave "
                "it at auto" + (", or set rollout.engine=vllm" if self.engine != "vllm" else
                                ", or set rollout.weight_transfer=stream"))
        return self


class RewardConfig(_Section):
    """Rule-based math-verify reward, optionally backed by a generative judge (PAPER.md section 4)."""

    timeout_s: float = Field(5.0, gt=0, description="time bound per verification (process pool)")
    num_workers: int = Field(1, ge=1, description="verification worker processes")
    judge_model: Optional[str] = Field(None, description="path/HF id of a judge model; None = judge off")
    judge_max_new_tokens: int = Field(64, ge=1, description="token budget of one judge answer")
    extraction: Literal["boxed", "boxed_or_final"] = Field(
        "boxed", description="final-answer extraction: 'boxed' = last \\boxed{} only, no box -> reward 0 (the "
        "training format incentive); 'boxed_or_final' = else a final-answer statement ('the answer is X', "
        "'Final answer: X', a lone option letter), for scoring other models' outputs (ulorl-eval's default)")


class MPTConfig(_Section):
    """Masking of well-mastered positive tokens (PAPER.md section 3, Eq. 10)."""

    mode: str = Field(
        "dynamic", description="masking of well-mastered positive tokens: 'off', 'static' (MPT, every step) or "
        "'dynamic' (DMMPT, only while entropy < sigma)", json_schema_extra={"choices": list(MASK_MODES)}
    )
    tau: float = Field(0.99, gt=0.0, le=1.0, description="MPT probability threshold, in (0, 1]")
    sigma: float = Field(0.2, ge=0.0, description="target entropy (dynamic mode)")
    entropy_scope: str = Field(
        "sample", description="entropy compared with sigma: the sample's mean token entropy, or the batch's",
        json_schema_extra={"choices": list(ENTROPY_SCOPES)},
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` as False; `mode: off` means the mode named "off"
        return "off" if v is False else v


class EntropyControlConfig(_Section):
    """Entropy-control comparators of DMMPTs (ulorl.algo.entropy_control; docs/beyond.md):
    'clip_cov' and 'kl_cov' (Cui et al. 2025, verl's loss modes of those names) act on the response
    tokens with the largest covariance (A - mean A)(logp - mean logp): Clip-Cov zeroes the loss of
    max(int(clip_cov_ratio * n), 1) tokens drawn at random among those with covariance in
    (clip_cov_lb, clip_cov_ub) and no active PPO clip; KL-Cov adds kl_cov_coef * |log r| to the
    max(1, int(kl_cov_ratio * n)) tokens of largest covariance and drops the PPO clip (as verl; on
    the paper's on-policy update, POIS with train.updates_per_step 1, r = 1 and the penalty is 0).
    'high_entropy_minority' (Wang et al. 2025, "Beyond the 80/20 Rule"; TRL's top_entropy_quantile)
    trains only the tokens whose entropy is in the batch's top top_entropy_quantile fraction.
    Selections come from the pre-update pass, once per step, over the step's whole batch; masked
    tokens stay in the loss denominator; the mask adds to algo.mpt's. Logged: train/entropy_control_frac.
    """

    mode: str = Field(
        "off", description="entropy control beside algo.mpt.mode: 'off', 'clip_cov', 'kl_cov' or "
        "'high_entropy_minority' (the 80/20 rule)", json_schema_extra={"choices": list(ENTROPY_CONTROLS)}
    )
    clip_cov_ratio: float = Field(
        2e-4, gt=0.0, le=1.0, description="clip_cov: fraction of the step's response tokens detached (verl's "
        "default 2e-4; sweeps/choice/entropy_controls.yaml raises it to DMMPTs' share)")
    clip_cov_lb: float = Field(1.0, description="clip_cov: only tokens with covariance > this (verl 1.0)")
    clip_cov_ub: float = Field(5.0, description="clip_cov: only tokens with covariance < this (verl 5.0)")
    kl_cov_ratio: float = Field(
        2e-4, gt=0.0, le=1.0, description="kl_cov: fraction of the step's response tokens KL-penalised (verl's "
        "default 2e-4)")
    kl_cov_coef: float = Field(0.1, ge=0.0, description="kl_cov: coefficient of |log r| (verl's ppo_kl_coef, 0.1)")
    top_entropy_quantile: float = Field(
        0.2, ge=0.0, le=1.0, description="high_entropy_minority: rho, the top-entropy fraction of response tokens "
        "trained (Wang et al. and TRL recommend 0.2; 1.0 trains every token)")

    @model_validator(mode="after")
    def _bounds(self) -> EntropyControlConfig:
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb ({self.clip_cov_lb}) must be < clip_cov_ub ({self.clip_cov_ub})")
        return self

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v


class RolloutCorrectionConfig(_Section):
    """Train / inference mismatch correction (ulorl.algo.rollout_correction; docs/algorithm.md, "Train /
    inference mismatch"). With rho = pi_old / mu per token (pi_old: the PPO ratio's denominator of algo.is_mode;
    mu: the engine's log-prob of the sampled token, at the version that decoded it) each mode weights the clipped
    surrogate: 'token_tis' min(rho, threshold) (truncated IS, Yao et al.; verl token_is); 'token_mis' rho, tokens
    with rho > threshold rejected (masked IS, TRL token_mask); 'seq_tis' / 'seq_mis' the same with rho the product
    over a sequence (seq_scope: the whole response, each segment with its own behaviour log-probs, or one
    segment); 'geo_tis' / 'geo_mis' the same with the product's geometric mean (length-normalised, stays near 1
    at 128k tokens; geo_mis rejects outside [1 / threshold, threshold]); 'icepop' rho, tokens outside
    [icepop_low, icepop_high] rejected (Ring-1T, arXiv 2510.18855).
    Rejected tokens leave the loss and stay in its denominator. The mismatch itself (mismatch/* metrics) is
    measured every step whatever the mode (measure: false skips it)."""

    mode: str = Field(
        "off", description="rollout correction: 'off', 'token_tis', 'token_mis', 'seq_tis', 'seq_mis', 'geo_tis', "
        "'geo_mis' (the sequence's geometric-mean ratio, GSPO-style) or 'icepop'",
        json_schema_extra={"choices": list(ROLLOUT_CORRECTIONS)})
    threshold: float = Field(
        2.0, ge=1.0, description="C of token_tis / token_mis / seq_tis / seq_mis / geo_tis / geo_mis (verl's "
        "rollout_is_threshold default 2.0; TRL documents C = 2 for TIS and MIS)")
    icepop_low: float = Field(0.5, ge=0.0, lt=1.0, description="icepop: alpha, tokens whose ratio is below it are "
                              "rejected (0.5 as prime-rl's first IcePop loss; open-instruct uses 1 / beta)")
    icepop_high: float = Field(5.0, gt=1.0, description="icepop: beta, tokens whose ratio is above it are rejected "
                               "(5.0, the value open-instruct and prime-rl give as IcePop's)")
    seq_scope: str = Field(
        "response", description="seq_tis / seq_mis: the sequence of the product, 'response' (every segment of the "
        "response, each with the behaviour log-probs of the version that decoded it) or 'segment' (each segment "
        "on its own)", json_schema_extra={"choices": list(SEQ_SCOPES)})
    measure: bool = Field(
        True, description="log the train / inference gap every update (mismatch/*: engine vs trainer log-probs of "
        "the same tokens under the same weights, by segment and position bucket); false: not measured")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v


class AlgoConfig(_Section):
    """Loss and importance sampling."""

    is_mode: str = Field(
        "pois", description="old log-probs of the ratio: 'pois' (recomputed by the current model), 'sais' (per "
        "segment's policy version), 'tois' (true on-policy, segments = 1)",
        json_schema_extra={"choices": list(IS_MODES)}
    )
    sais_logprobs: Literal["auto", "trainer", "engine"] = Field(
        "auto", description="SAIS old log-probs of each segment: 'trainer' (a forward of the training model at the "
        "segment's version), 'engine' (the rollout engine's sampled-token log-probs, same weights), 'auto' (engine "
        "under ZeRO-3 with vllm engines, where no rank holds a full copy to run that forward; else trainer)")
    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="lower clip: ratio >= 1 - eps_low")
    eps_high: float = Field(0.2, ge=0.0, description="upper clip: ratio <= 1 + eps_high (clip-higher when > eps_low)")
    adv_eps: float = Field(1e-6, gt=0, description="added to the group std in the advantage denominator")
    adv_std: Literal["population", "unbiased"] = Field(
        "population",
        description="group std in the advantage (r - mean) / (std + adv_eps): 'population' divides the "
        "variance by G (the default), 'unbiased' by G - 1 (torch.std, as verl and DeepSeekMath)",
    )
    dynamic_sampling: bool = Field(True, description="drop groups whose rewards are all equal (no learning signal)")
    dynamic_sampling_fill: bool = Field(
        False, description="DAPO-style fill: a training step keeps rolling out (admitting new prompts each round) "
        "until rollout.min_ready_groups groups with mixed rewards are ready, instead of training on what survives"
    )
    dynamic_sampling_fill_max_rounds: int = Field(
        8, ge=1, description="with dynamic_sampling_fill: most rollout rounds in one training step (then it trains "
        "on what is ready, or skips)"
    )
    loss_agg: str = Field(
        "token_mean", description="loss aggregation: 'token_mean' (sum / all response tokens, Eq. 10, the paper's) "
        "or 'seq_mean' (mean over sequences of per-sequence means, GRPO)", json_schema_extra={"choices": list(LOSS_AGG)}
    )
    mpt: MPTConfig = Field(MPTConfig(), description="masking of well-mastered positive tokens")
    entropy_control: EntropyControlConfig = Field(
        EntropyControlConfig(), description="entropy-control comparators (Clip-Cov, KL-Cov, 80/20 rule)")
    rollout_correction: RolloutCorrectionConfig = Field(
        RolloutCorrectionConfig(), description="train / inference mismatch: its measurement and correction "
        "(token / sequence TIS and MIS, IcePop)")
    routing_replay: Literal["off", "r3"] = Field(
        "off", description="MoE models: 'r3' routes each response token in the trainer's forward to the experts the "
        "rollout engine chose (rollout routing replay, arXiv 2510.11370; gate weights from the trainer's router "
        "logits over them); 'off' lets the trainer route. The routing mismatch (mismatch/routing/*) is logged "
        "either way when the engine returns routes (ulorl.train.routing_replay)")

    @model_validator(mode="after")
    def _correction_with_kl_cov(self) -> AlgoConfig:
        mode = self.rollout_correction.mode
        if mode != "off" and self.entropy_control.mode == "kl_cov":
            raise ValueError(
                f"algo.rollout_correction.mode={mode} cannot be combined with algo.entropy_control.mode=kl_cov: KL-Cov "
                "replaces the clipped surrogate with its own loss, which takes no correction weight; set one of them "
                "to off")
        return self


class DeepSpeedConfig(_Section):
    """DeepSpeed ZeRO settings (train.backend = deepspeed; ranks = resources.trainer_workers)."""

    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="ZeRO stage (2: optimizer + gradients sharded, 3: + parameters)")
    offload_optimizer: bool = Field(False, description="keep optimizer state in CPU memory")
    max_live_parameters: int = Field(
        1_000_000_000, ge=1, description="ZeRO-3: parameter elements a rank may hold gathered at once before it "
        "releases some (DeepSpeed's stage3_max_live_parameters, its default)")
    max_reuse_distance: int = Field(
        1_000_000_000, ge=0, description="ZeRO-3: a gathered parameter needed again within this many parameter "
        "elements stays gathered (stage3_max_reuse_distance, DeepSpeed's default)")
    prefetch_bucket_size: int = Field(
        50_000_000, ge=0, description="ZeRO-3: parameter elements gathered ahead of their use "
        "(stage3_prefetch_bucket_size, DeepSpeed's default)")


class ResourcesConfig(_Section):
    """Placement of one run (Ray placement group): trainer workers and rollout engines."""

    trainer_workers: int = Field(1, ge=1, description="trainer processes (DeepSpeed ranks)")
    rollout_engines: int = Field(1, ge=1, description="rollout engine actors")
    gpus_per_trainer_worker: float = Field(0.0, ge=0, description="GPUs reserved per trainer worker")
    gpus_per_engine: float = Field(0.0, ge=0, description="also the vLLM tensor-parallel size when > 1")
    cpus_per_trainer_worker: float = Field(1.0, gt=0, description="CPUs reserved per trainer worker")
    cpus_per_engine: float = Field(1.0, gt=0, description="CPUs reserved per rollout engine")
    nodes: int = Field(1, ge=1, description="machines the run spans: 1 packs every bundle on one node (STRICT_PACK), "
                      "more packs roles per node and spreads them over nodes (PACK)")
    gpus_per_node: Optional[float] = Field(
        None, ge=0, description="GPUs of one node (e.g. 8); with cpus_per_node, --dry-run lays the bundles out on "
        "`nodes` such nodes and refuses a layout that does not fit; None = not declared")
    cpus_per_node: Optional[float] = Field(None, gt=0, description="CPUs of one node; None = not declared")
    gpu_memory_gib: float = Field(80.0, gt=0, description="memory of one GPU; the dry-run plan checks the trainer fits")


class TrainConfig(_Section):
    """Optimizer, step loop and checkpoints."""

    backend: Literal["torch", "deepspeed"] = Field("torch", description="'torch' (one process) or 'deepspeed' (ZeRO)")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (constant)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    grad_clip: float = Field(1.0, gt=0, description="clip the gradient norm to this value")
    max_steps: int = Field(50, ge=1, description="rollout steps of the run")
    updates_per_step: int = Field(
        1, ge=1,
        description="mini-batch updates (optimizer steps) per rollout step; the paper uses 1. With more than 1, "
        "the old log-probs, the MPT mask and the DMMPT entropy gate all come from the pre-update model "
        "(one no-grad pass before the first optimizer step), for every mini-batch",
    )
    micro_batch_tokens: int = Field(8192, ge=1, description="token budget of one forward/backward")
    bf16: bool = Field(False, description="bfloat16 autocast for training forwards")
    seed: int = Field(0, description="seed of python / numpy / torch at start-up")
    threads: Optional[int] = Field(None, ge=1, description="torch threads; default = cores available")
    output_dir: str = Field("runs", description="run folders go to output_dir/<name>/<timestamp>")
    checkpoint_every: int = Field(10, ge=1, description="checkpoint every N steps (and at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    max_wall_s: Optional[float] = Field(None, gt=0, description="stop (checkpointed) after this many seconds")
    deepspeed: DeepSpeedConfig = Field(DeepSpeedConfig(), description="DeepSpeed settings (backend = deepspeed)")
    # long rows (ulorl.train.forward, ulorl.algo.chunked_lm_head)
    gradient_checkpointing: bool = Field(False, description="recompute decoder layers in backward (activation memory)")
    logprob_path: Literal["chunked", "full"] = Field(
        "chunked", description="chunked: hidden states through lm_head in token chunks; full: [T, V] model logits"
    )
    logprob_chunk_tokens: Optional[int] = Field(
        None, ge=1, description="tokens per lm_head chunk; default: float32 [chunk x vocab] of <= 2**25 elements"
    )
    sequence_parallel: int = Field(
        1, ge=1, description="sequence-parallel degree: rows over micro_batch_tokens are split along the sequence over "
        "this many ranks (DeepSpeed Ulysses; backend deepspeed, WORLD_SIZE a multiple of it)"
    )
    # where the entropy goes (ulorl.train.entropy_probe, docs/entropy.md)
    entropy_probe_every: int = Field(
        0, ge=0, description="every N steps, the exact first-order entropy change of the update split by token "
        "class (entropy/exact/*: extra backward passes over full [B, L, V] logits, for tiny models; backend torch, "
        "updates_per_step 1); 0 = off. The cheap proxies (entropy/proxy/*) are logged every step regardless")
    entropy_probe_batch: Literal["step", "fixed"] = Field(
        "step", description="whose mean token entropy the probe differentiates: 'step' (the step's own trained "
        "batch, what train/entropy measures) or 'fixed' (the first probed step's batch, kept for the run)")

    @model_validator(mode="after")
    def _probe_needs_one_process(self) -> TrainConfig:
        if self.entropy_probe_every and (self.backend != "torch" or self.updates_per_step != 1):
            raise ValueError(f"train.entropy_probe_every ({self.entropy_probe_every}) needs train.backend torch and "
                             f"train.updates_per_step 1 (got {self.backend!r}, {self.updates_per_step}): the probe "
                             "linearises one AdamW step of one process; set train.entropy_probe_every=0")
        if self.entropy_probe_every > self.max_steps:   # it probes steps that are its multiples: none would be
            raise ValueError(f"train.entropy_probe_every ({self.entropy_probe_every}) is above train.max_steps "
                             f"({self.max_steps}), so the probe would never run; set it to at most "
                             f"{self.max_steps} (every N steps), or 0 for off")
        return self


class TrackingConfig(_Section):
    """MLflow tracking: where runs go and what they carry."""

    uri: Optional[str] = Field(None, description="MLflow URI; else $MLFLOW_TRACKING_URI; else sqlite:///./mlflow.db")
    experiment: str = Field("ulorl", description="MLflow experiment name")
    run_name: Optional[str] = Field(None, description="MLflow run name; default = the experiment's name")
    paper_ref: Optional[Literal["table1", "table2", "table3", "fig2", "fig4", "fig5"]] = Field(
        None, description="which paper table / figure the run belongs to (tag read by ulorl-tables)"
    )
    sample_every: int = Field(5, ge=1, description="log sampled responses every N steps")
    samples_per_log: int = Field(4, ge=0, description="responses per sample log (0 = none)")
    tags: dict[str, str] = Field(default_factory=dict, description="extra MLflow tags of the run")
    server_host: str = Field(
        "127.0.0.1", description="address the tracking server a sweep starts listens on; anything but loopback "
        "(e.g. the head node's IP, or 0.0.0.0) turns on MLflow basic auth")
    server_auth: Optional[bool] = Field(
        None, description="basic auth on the sweep's tracking server: None = on exactly when it listens beyond "
        "loopback; true forces it on 127.0.0.1 too; false beyond loopback is refused")
    auth_env: str = Field(
        "ULORL_MLFLOW_PASSWORD", description="environment variable holding the tracking server's admin password "
        "when it listens beyond loopback (generated when unset; never printed or logged)")


class FinalEvalConfig(_Section):
    """One evaluation after the last training step on held-out problems no periodic eval scores
    (eval/<bench>_final/*, ulorl.eval.final): many samples on many fresh problems, so the verdicts that
    read it carry little evaluation noise, while the periodic evals a search selects on stay cheap."""

    k: int = Field(0, ge=0, description="responses per problem of the final evaluation; 0 = no final evaluation")
    num_problems: int = Field(512, ge=1, description="held-out problems it scores: the first ones after the "
                              "periodic eval's eval.num_problems whose prompt no periodic eval scores (duplicates "
                              "skipped); embedded tasks: raise data.task.num_heldout to hold them")


class EvalConfig(_Section):
    """Periodic held-out evaluation during training (avg@k on data.heldout)."""

    every: int = Field(10, ge=0, description="periodic held-out eval every N steps (0 = off)")
    k: int = Field(4, ge=1, description="responses per problem (avg@k, pass@k)")
    num_problems: Optional[int] = Field(64, ge=1, description="first N held-out problems; None = all")
    temperature: float = Field(0.85, gt=0, description="eval sampling temperature")
    top_p: float = Field(0.95, gt=0, le=1.0, description="eval nucleus sampling mass")
    top_k: int = Field(20, ge=-1, description="eval top-k (-1 = off)")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="default: rollout.max_response_len")
    seed: int = Field(1234, description="seed of the eval sampling draws")
    select_problems: int = Field(
        0, ge=0, description="split the evaluated problems: the first N are the selection part (eval/<bench>_select/*, "
        "what a sweep optimises), the rest the confirmation part (eval/<bench>_confirm/*, what its verdict scores); "
        "eval/<bench>/* stays the whole set; 0 = no split")
    final: FinalEvalConfig = Field(FinalEvalConfig(), description="one evaluation after the last step on held-out "
                                   "problems the periodic evals never score, with its own k and problem count")

    @model_validator(mode="after")
    def _split_inside(self) -> EvalConfig:
        if self.select_problems and self.num_problems is not None and self.select_problems >= self.num_problems:
            raise ValueError(f"eval.select_problems ({self.select_problems}) must be below eval.num_problems "
                             f"({self.num_problems}): the rest are the confirmation problems")
        if self.final.k and self.every and self.num_problems is None:
            raise ValueError("eval.final.k needs eval.num_problems set: the final evaluation scores the held-out "
                             "problems after the periodic eval's, and eval.num_problems None (all) leaves none")
        return self


def path_component_problem(name: Any) -> Optional[str]:
    """Why ``name`` is not one folder name (None when it is): run and sweep names become a folder under
    their output folder, so a separator, ``.``/``..``, an absolute path or an empty name would put files
    outside it (or nowhere)."""
    if not isinstance(name, str) or not name.strip():
        return "is empty"
    if name in (".", ".."):
        return f"is {name!r}, which names no folder of its own"
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad:
        return f"contains {bad[0]!r}"
    return None


def check_path_component(name: Any, where: str) -> None:
    """Raise ``ValueError`` when ``name`` is not one path component (see :func:`path_component_problem`);
    ``where`` says which folder the name becomes."""
    why = path_component_problem(name)
    if why:
        raise ValueError(f"must be one folder name, as it names {where}: this one {why}; use letters, digits, "
                         "'-', '_' and '.' (e.g. my_run)")


class ExperimentConfig(_Section):
    """One experiment: every section, with cross-section checks."""

    name: str = Field("experiment", description="experiment name (default: the YAML file's stem); one folder "
                      "name: the run's folder is train.output_dir/<name>/<timestamp>")

    @field_validator("name")
    @classmethod
    def _one_folder(cls, v: str) -> str:
        check_path_component(v, "the run's folder under train.output_dir")
        return v
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    reward: RewardConfig = RewardConfig()
    resources: ResourcesConfig = ResourcesConfig()
    train: TrainConfig = TrainConfig()
    tracking: TrackingConfig = TrackingConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        r = self.rollout
        if r.max_response_len % r.segments != 0:
            raise ValueError(
                f"rollout.max_response_len ({r.max_response_len}) must be divisible by "
                f"rollout.segments ({r.segments})"
            )
        if self.algo.is_mode == "tois" and r.segments > 1:
            raise ValueError(
                f"algo.is_mode=tois (true on-policy) requires rollout.segments=1, got {r.segments}; "
                "use pois or sais with segments > 1"
            )
        if self.algo.dynamic_sampling_fill and not self.algo.dynamic_sampling:
            raise ValueError("algo.dynamic_sampling_fill=true requires algo.dynamic_sampling=true")
        n_heldout, n_eval = self.data.task.num_heldout, self.eval.num_problems
        if (self.eval.every and n_eval is not None and n_eval > n_heldout
                and self.data.heldout.split(":")[0] == "embedded"):
            # refused, not clamped: the run would record eval.num_problems while scoring fewer problems
            raise ValueError(
                f"eval.num_problems ({n_eval}) is more than the embedded held-out split holds (data.task.num_heldout "
                f"{n_heldout}): the periodic eval would score {n_heldout} problems while the run records {n_eval}; "
                f"raise data.task.num_heldout to {n_eval} or more (the held-out split is a prefix of one stream: its "
                f"first problems stay the same), or lower eval.num_problems to {n_heldout} (or null: all)")
        corr = self.algo.rollout_correction.mode
        if corr != "off" and self.algo.is_mode == "sais" and sais_logprobs_source(self) == "engine":
            raise ValueError(
                f"algo.rollout_correction.mode={corr} with algo.is_mode=sais needs the trainer's SAIS log-probs, but "
                f"algo.sais_logprobs={self.algo.sais_logprobs} takes them from the engine here, so the correction "
                "ratio pi_old / mu would be 1 on every token (no correction); set algo.sais_logprobs=trainer, or "
                "algo.is_mode=pois, or algo.rollout_correction.mode=off")
        if self.algo.is_mode == "tois" and r.min_ready_groups > r.prompts_per_step:
            raise ValueError(
                f"algo.is_mode=tois (true on-policy) requires rollout.min_ready_groups <= "
                f"rollout.prompts_per_step, got rollout.min_ready_groups={r.min_ready_groups} > "
                f"rollout.prompts_per_step={r.prompts_per_step}: groups would wait across policy versions"
            )
        if self.algo.is_mode == "tois" and r.schedule == "overlap" and r.overlap_staleness > 0:
            raise ValueError(
                "algo.is_mode=tois (true on-policy) cannot train rollout.schedule=overlap's segments, decoded one "
                "version before the update; set rollout.overlap_staleness=0, rollout.schedule=sync, or "
                "algo.is_mode=sais (old log-probs at each segment's decoding version)")
        return self


def sais_logprobs_source(cfg: ExperimentConfig) -> Literal["trainer", "engine"]:
    """Where SAIS old log-probs come from (``algo.sais_logprobs``): 'engine' (the rollout engine's sampled-token
    log-probs; ``auto``: under ZeRO-3 with vllm engines, where no rank holds a full copy for a trainer
    forward) or 'trainer' (a forward of the training model at each segment's version)."""
    choice = cfg.algo.sais_logprobs
    if choice == "auto":
        zero3 = cfg.train.backend == "deepspeed" and cfg.train.deepspeed.zero_stage == 3
        return "engine" if zero3 and cfg.rollout.engine == "vllm" else "trainer"
    return "engine" if choice == "engine" else "trainer"


# ----------------------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[str, Any]:
    """``'algo.mpt.tau=0.95'`` -> ``('algo.mpt.tau', 0.95)`` (value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    if raw.strip().lower() in ("on", "off", "yes", "no", "y", "n"):
        return key, raw.strip()  # YAML 1.1 booleans: keep the word (e.g. algo.mpt.mode=off)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: list[str] | dict[str, Any],
                    source: str = "override") -> dict[str, Any]:
    """Return a copy of ``data`` with dotted overrides set (intermediate dicts created)."""
    out = copy.deepcopy(data)
    items = overrides.items() if isinstance(overrides, dict) else (parse_override(o) for o in overrides)
    for key, value in items:
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"{source}: cannot set {key!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = nxt
        node[parts[-1]] = value
    return out


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid experiment config in {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            near = difflib.get_close_matches(path, sorted(known_keys()), n=1)
            msg = "unknown key" + (f" (did you mean {near[0]}?)" if near else "")
        inp = e.get("input")
        shown = "" if e["type"] == "extra_forbidden" or isinstance(inp, dict) else f" (got {inp!r})"
        lines.append(f"  {path}: {msg}{shown}" if path else f"  {msg}")
    return "\n".join(lines)


def _format_errors_of(data: dict[str, Any], source: str) -> str:
    try:
        ExperimentConfig.model_validate(data)
    except ValidationError as err:
        return _format_errors(err, source)
    return f"invalid experiment config in {source}"


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def yaml_file_problem(p: Path, what: str) -> Optional[str]:
    """Why ``p`` cannot be read as a ``what`` YAML file (None when it is a file): it does not exist, or it
    is a folder (its YAML files are named)."""
    if p.is_dir():
        found = sorted(x.name for x in p.glob("*.y*ml"))
        listed = (f"; it holds {', '.join(found[:6])}{', ...' if len(found) > 6 else ''}" if found
                  else "; it holds no .yaml file")
        return f"{what} {p} is a folder, not a file: give one YAML file{listed}"
    if not p.is_file():
        return f"{what} file not found: {p}"
    return None


def read_utf8_text(p: Path) -> str:
    """The text of ``p`` decoded as UTF-8; else ``ConfigError`` naming the file, the line and the byte,
    with the conversion command."""
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        fixed = p.with_name(f"{p.stem}.utf8{p.suffix}")
        raise ConfigError(f"{p}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); YAML files must be UTF-8: "
                          f"convert it, e.g. iconv -f latin1 -t utf-8 {p} > {fixed}") from None


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    problem = yaml_file_problem(p, "experiment")
    if problem:
        raise ConfigError(problem)
    try:
        data = yaml.safe_load(read_utf8_text(p)) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections, got {type(data).__name__}")
    if not data:  # an empty file would silently run every default
        raise ConfigError(f"{p}: the experiment file is empty (no section, no key), so every setting would be a "
                          "default; start from experiments/quickstart.yaml, or list the keys it changes "
                          "(ulorl-train --explain shows them all)")
    return data


def load_experiment(path: str | os.PathLike, overrides: list[str] | dict[str, Any] | None = None) -> ExperimentConfig:
    """Load an experiment YAML, apply dotted overrides, validate. Errors name file and key path."""
    data = read_yaml(path)
    data.setdefault("name", Path(path).stem)
    if not overrides:
        return config_from_dict(data, source=str(path))
    try:
        return config_from_dict(apply_overrides(data, overrides, source="command-line override"), source=str(path))
    except ConfigError:
        config_from_dict(data, source=str(path))  # the file alone is invalid: that error names the file
        shown = overrides if isinstance(overrides, list) else [f"{k}={v}" for k, v in overrides.items()]
        raise ConfigError(_format_errors_of(apply_overrides(data, overrides, source="command-line override"),
                                            f"the command-line override(s) {' '.join(shown)} (on {path})")) from None


def flatten_config(cfg: ExperimentConfig | dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"mpt": {"tau": 0.99}}}`` -> ``{"algo.mpt.tau": 0.99}`` (lists/None kept as values)."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, prefix=path + "."))
        else:
            out[path] = value
    return out


def config_to_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def known_keys() -> set[str]:
    """Every dotted key of the schema (sweep validation uses this)."""
    return set(flatten_config(ExperimentConfig()).keys()) | {
        "tracking.tags", "model.rope_scaling",
    }
