"""The settings ``ulorl-bench peer`` makes equal between ulorl and TRL's ``GRPOTrainer``, in one place.

``PeerConfig`` holds the shared knobs (prompts per step, G, max response length, temperature, lr,
clip bounds, steps, ...). From it, ``ulorl_experiment`` builds the ulorl experiment of one
system (segment count S, batching) and ``trl_arguments`` the keyword arguments of TRL's
``GRPOConfig``; ``settings_rows`` states, setting by setting, the value on each side and whether
the two are equal, so the printed table and the code that runs cannot drift apart.

The equalised algorithm is the one both can run: GRPO group advantages with the unbiased group
std + 1e-4 (TRL's ``scale_rewards="group"``; ulorl ``algo.adv_std=unbiased``, ``adv_eps=1e-4``),
the clipped token-level loss summed over the step's response tokens and divided by their count
(TRL ``loss_type="dapo"``, ulorl ``token_mean``, Eq. 10), clip-higher bounds, no KL, one optimizer
step per rollout (so the ratio is 1 at that step on both sides: TRL's old log-probs are the
training pass's own, ulorl's POIS recomputes them with the same weights), no dynamic sampling
(TRL has none), no token masking, truncated responses rewarded 0 and trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ulorl.data.profiles import parse_embedded

#: the TRL release the bench and the oracle tests were written against (the ``peer`` extra pins it)
TRL_VERSION = "1.16.0"
#: TRL's advantage denominator: the unbiased group std plus this (``grpo_trainer.py``)
TRL_ADV_EPS = 1e-4
PEER_EXTRA_MESSAGE = (f"ulorl-bench peer needs TRL: pip install 'ulorl[peer]' (trl=={TRL_VERSION}); "
                      "--no-trl runs the ulorl systems alone")

SystemKind = Literal["trl", "ulorl"]


@dataclass
class PeerConfig:
    """Settings of one ``ulorl-bench peer`` run (all printed and stored in the JSON ``config``)."""

    steps: int = 12                   # training steps of every system, every repeat
    warmup: int = 4                   # first steps left out of the per-step figures (>= the largest S)
    repeats: int = 2                  # fresh runs of every system (seed + repeat), one after the other
    prompts: int = 8                  # new prompts per step (TRL: generation batch / G)
    group: int = 8                    # G responses per prompt
    max_len: int = 512                # global max response length (tokens)
    temperature: float = 0.85         # rollout sampling; log-probs are of logits / temperature on both sides
    lr: float = 1e-4                  # AdamW, constant
    eps_low: float = 0.2              # ratio >= 1 - eps_low
    eps_high: float = 0.28            # ratio <= 1 + eps_high (clip-higher, DAPO's value)
    grad_clip: float = 1.0            # gradient-norm clip
    micro_batch_tokens: int = 16384   # ulorl's training micro-batch budget (TRL forwards the batch at once)
    segments: tuple[int, ...] = (1, 4)
    regimes: tuple[str, ...] = ("static", "compact")
    trl: bool = True                  # include TRL's GRPOTrainer
    threads: int = 1                  # torch threads of every system (1: robust on a shared 2-core machine)
    seed: int = 0
    eval_problems: int = 64           # held-out problems scored after the steps (same evaluator for all)
    eval_k: int = 2                   # responses per held-out problem
    model: str = "embedded"           # an embedded profile's model: ``embedded`` or ``embedded:<profile>``

    def validate(self) -> None:
        if self.steps < 1 or self.repeats < 1:
            raise ValueError("--steps and --repeats must be >= 1")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"--warmup must be in 0..steps-1 ({self.steps - 1}), got {self.warmup}")
        if self.prompts < 1 or self.group < 2 or self.max_len < 1:
            raise ValueError("--prompts must be >= 1, --group >= 2 (TRL's GRPO needs 2) and --max-len >= 1")
        if not self.segments or any(s < 1 or self.max_len % s for s in self.segments):
            raise ValueError(f"--segments must divide --max-len {self.max_len}, got {list(self.segments)}")
        if not self.regimes or any(r not in ("static", "compact") for r in self.regimes):
            raise ValueError(f"--regimes must be a subset of static,compact, got {list(self.regimes)}")
        if not 0 <= self.eps_low < 1 or self.eps_high < 0 or self.lr <= 0 or self.temperature <= 0:
            raise ValueError("need 0 <= --eps-low < 1, --eps-high >= 0, --lr > 0 and --temperature > 0")
        if self.threads < 1 or self.eval_problems < 1 or self.eval_k < 1:
            raise ValueError("--threads, --eval-problems and --eval-k must be >= 1")
        if parse_embedded(self.model) is None:
            raise ValueError(f"--model must name an embedded profile ('embedded' or 'embedded:<profile>'), got "
                             f"{self.model!r}: the bench trains on that profile's task")


@dataclass(frozen=True)
class System:
    """One trainer of the comparison: TRL's ``GRPOTrainer``, or ulorl at segment count S and a batching."""

    kind: SystemKind
    segments: int = 1
    batching: str = "static"

    @property
    def name(self) -> str:
        return "TRL GRPOTrainer" if self.kind == "trl" else f"ulorl S={self.segments} {self.batching}"

    @property
    def slug(self) -> str:
        return "trl" if self.kind == "trl" else f"ulorl-s{self.segments}-{self.batching}"


def systems_of(cfg: PeerConfig) -> list[System]:
    """TRL first (when on), then ulorl for every S x batching."""
    out = [System("trl")] if cfg.trl else []
    out += [System("ulorl", s, b) for s in cfg.segments for b in cfg.regimes]
    return out


def ulorl_experiment(cfg: PeerConfig, system: System, seed: int, workdir: Path) -> dict[str, Any]:
    """The ulorl experiment (``config_from_dict`` input) of ``system`` at the equalised settings."""
    return {
        "name": f"peer-{system.slug}",
        "model": {"name_or_path": cfg.model},
        "data": {"train": cfg.model, "heldout": cfg.model, "seed": seed, "shuffle": True},
        "rollout": {"engine": "hf", "segments": system.segments, "max_response_len": cfg.max_len,
                    "prompts_per_step": cfg.prompts, "group_size": cfg.group, "temperature": cfg.temperature,
                    "top_p": 1.0, "top_k": -1, "batching": system.batching, "min_ready_groups": 1, "seed": seed},
        "algo": {"is_mode": "pois", "eps_low": cfg.eps_low, "eps_high": cfg.eps_high, "adv_std": "unbiased",
                 "adv_eps": TRL_ADV_EPS, "dynamic_sampling": False, "loss_agg": "token_mean",
                 "mpt": {"mode": "off"}, "entropy_control": {"mode": "off"}},
        "train": {"backend": "torch", "lr": cfg.lr, "weight_decay": 0.0, "betas": [0.9, 0.999],
                  "grad_clip": cfg.grad_clip, "max_steps": cfg.steps, "updates_per_step": 1,
                  "micro_batch_tokens": cfg.micro_batch_tokens, "bf16": False, "gradient_checkpointing": False,
                  "seed": seed, "threads": cfg.threads, "output_dir": str(workdir / "runs")},
        "tracking": {"uri": f"sqlite:///{(workdir / 'mlflow.db').resolve()}", "experiment": "ulorl-bench-peer",
                     "samples_per_log": 0},
        "eval": {"every": 0, "k": cfg.eval_k, "num_problems": cfg.eval_problems},
    }


def trl_arguments(cfg: PeerConfig, seed: int, output_dir: Path) -> dict[str, Any]:
    """Keyword arguments of TRL's ``GRPOConfig`` at the equalised settings (CPU, no vLLM, float32)."""
    return {
        "output_dir": str(output_dir), "use_cpu": True, "bf16": False, "fp16": False,
        "gradient_checkpointing": False, "seed": seed, "report_to": "none", "save_strategy": "no",
        "logging_steps": 1, "disable_tqdm": True, "dataloader_num_workers": 0, "shuffle_dataset": False,
        # batch: one generation batch of prompts x G, trained in one optimizer step
        "per_device_train_batch_size": cfg.prompts * cfg.group, "gradient_accumulation_steps": 1,
        "steps_per_generation": 1, "num_iterations": 1, "num_generations": cfg.group, "max_steps": cfg.steps,
        # sampling
        "max_completion_length": cfg.max_len, "temperature": cfg.temperature, "top_p": 1.0, "top_k": 0,
        "use_vllm": False,
        # optimizer: AdamW, constant lr, no warm-up, no weight decay, the same clip
        "optim": "adamw_torch", "learning_rate": cfg.lr, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
        "max_grad_norm": cfg.grad_clip,
        # loss: clip-higher, token-level over the step's tokens, no KL, no masking
        "epsilon": cfg.eps_low, "epsilon_high": cfg.eps_high, "beta": 0.0, "loss_type": "dapo",
        "scale_rewards": "group", "mask_truncated_completions": False, "top_entropy_quantile": 1.0,
    }


def settings_rows(cfg: PeerConfig) -> list[dict[str, str]]:
    """Setting by setting: the ulorl value, the TRL value and ``equal`` ("yes" or what differs)."""
    p, g = cfg.prompts, cfg.group

    def row(setting: str, ulorl: str, trl: str, equal: str = "yes") -> dict[str, str]:
        return {"setting": setting, "ulorl": ulorl, "trl": trl, "equal": equal}

    return [
        row("prompts per step, G", f"rollout.prompts_per_step={p}, group_size={g}",
            f"per_device_train_batch_size={p * g}, num_generations={g}"),
        row("max response length", f"rollout.max_response_len={cfg.max_len}", f"max_completion_length={cfg.max_len}"),
        row("sampling", f"temperature={cfg.temperature}, top_p=1, top_k off",
            f"temperature={cfg.temperature}, top_p=1.0, top_k=0"),
        row("optimizer", f"AdamW lr={cfg.lr:g} constant, betas 0.9/0.999, eps 1e-8, wd 0, clip {cfg.grad_clip:g}",
            f"adamw_torch learning_rate={cfg.lr:g}, lr_scheduler_type=constant, weight_decay=0, "
            f"max_grad_norm={cfg.grad_clip:g}"),
        row("clip bounds", f"algo.eps_low={cfg.eps_low}, eps_high={cfg.eps_high}",
            f"epsilon={cfg.eps_low}, epsilon_high={cfg.eps_high}"),
        row("loss aggregation", "token_mean: sum over the step's response tokens / their count",
            "loss_type=dapo (num_items_in_batch)"),
        row("KL", "none", "beta=0.0"),
        row("updates per rollout", "train.updates_per_step=1", "num_iterations=1, steps_per_generation=1"),
        row("advantages", f"algo.adv_std=unbiased, adv_eps={TRL_ADV_EPS:g}", "scale_rewards=group (std + 1e-4)"),
        row("dynamic sampling", "algo.dynamic_sampling=false", "none (all-equal groups: advantage 0, tokens counted)"),
        row("token masking", "algo.mpt.mode=off, entropy_control off", "top_entropy_quantile=1.0"),
        row("old log-probs", "is_mode=pois: recomputed, same weights (ratio 1)", "training pass, detached (ratio 1)"),
        row("truncated responses", "reward 0, trained", "reward 0 (same scorer), mask_truncated_completions=False"),
        row("reward", "math-verify RewardScorer", "a reward function calling the same RewardScorer"),
        row("precision, checkpointing", "float32, gradient checkpointing off",
            "bf16=False (float32), gradient_checkpointing=False"),
        row("prompt order", f"data.seed={cfg.seed}+repeat, shuffled", "the same sequence (shuffle_dataset=False)"),
        row("steps, threads", f"{cfg.steps} steps, {cfg.threads} torch thread(s)",
            f"max_steps={cfg.steps}, {cfg.threads} torch thread(s)"),
        row("sampling draws", "counter-based uniform per (seed, request, position)", "torch.multinomial after set_seed",
            "no: same distribution, different draws (responses differ)"),
        row("rollout", "segment rollout over the hf engine (FastCausalLM decode, static / compact batching)",
            "model.generate (transformers DynamicCache), every row keeps its slot until the batch ends",
            "no: this is what is compared (S = 1 static is TRL's schedule)"),
        row("pre-update pass", "one no-grad forward over the batch (POIS old log-probs, entropy)",
            "none (old = the training pass's own log-probs)", "no: ulorl runs one more forward"),
        row("training batches", f"length-sorted micro-batches of <= {cfg.micro_batch_tokens} padded tokens",
            "the whole batch in one forward, padded to its longest prompt + completion",
            "no: same loss and gradient, different padding and memory"),
        row("samples per step", "S = 1: prompts x G; S > 1: the groups that finished this step",
            "prompts x G", "no: compare per trained sample"),
    ]
