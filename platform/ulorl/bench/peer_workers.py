"""Worker processes of ``ulorl-bench peer``: one trainer per process, stepped by the coordinator.

Each system (TRL's ``GRPOTrainer``, or ulorl's ``Trainer`` at one S and batching) lives in its own
spawned process, so its peak memory is its own (``VmHWM``), library state (TRL's seeds and
accelerate, ulorl's pools) never mixes, and the coordinator can interleave the systems step by
step. The process answers commands on a pipe:

    "step" -> {"wall_s", "cpu_s", "rollout_s", "rollout_cpu_s", "update_s", "update_cpu_s", "samples",
               "tokens", "train_real_tokens", "train_padded_tokens", "reward_mean", "rss_mb", "peak_rss_mb"}
    "eval" -> the held-out score of the current weights (the same evaluator for every system)
    "stop" -> {"peak_rss_mb", "rss_mb"}, then the process ends

``wall_s`` is the step's wall time; ``cpu_s`` the process CPU time it used (less sensitive to
other load on a shared machine); ``rollout_*`` generation plus reward scoring (timed around the
trainer's own rollout call: ulorl's ``Trainer.rollout_round``, TRL's ``_generate_and_score_completions``,
which also computes the advantages); ``update_*`` the rest of the step (forward, backward,
optimizer, weight hand-over to the engine, logging). ``train_real_tokens`` / ``train_padded_tokens``:
prompt + response tokens of the trained batch, and the tokens one training forward runs on with its
padding (ulorl: its micro-batches, plus ``first_fit_padded_tokens``, the split it used before; TRL:
the batch padded to its widest prompt + completion). ulorl runs two forwards over them (the no-grad
pre-update pass and the training pass), TRL one.

TRL's ``train()`` owns its loop, so its worker steps it from a ``TrainerCallback``: the step's
timer starts when a "step" command arrives (``on_train_begin`` for the first), stops at
``on_step_end``, which answers and waits for the next command. Its rollout time is measured
around ``_generate_and_score_completions`` (generation, decoding, rewards and advantages).
"""

from __future__ import annotations

import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Optional, Protocol, cast

from ulorl.bench.peer_settings import PEER_EXTRA_MESSAGE, PeerConfig, System, trl_arguments, ulorl_experiment


def process_memory_mb() -> dict[str, Optional[float]]:
    """``{"rss_mb", "peak_rss_mb"}`` of this process (``/proc/self/status`` VmRSS / VmHWM; elsewhere
    the peak from ``getrusage`` and no current value)."""
    try:
        fields = {}
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = float(rest.split()[0]) / 1024.0
        return {"rss_mb": fields.get("VmRSS"), "peak_rss_mb": fields.get("VmHWM")}
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"rss_mb": None, "peak_rss_mb": peak / (1024.0 * 1024.0 if sys.platform == "darwin" else 1024.0)}


def first_fit_padded_tokens(lengths: list[int], token_budget: int) -> int:
    """Padded tokens of the first-fit split ulorl used before ``ulorl.train.batch.padding_plan``: rows
    in length order, a new micro-batch only when the next row would push rows x longest over the
    budget (a reference count for the report; nothing trains with it)."""
    total = rows = longest = 0
    for n in sorted(lengths):
        if rows and max(longest, n) * (rows + 1) > token_budget:
            total += rows * longest
            rows = longest = 0
        rows, longest = rows + 1, max(longest, n)
    return total + rows * longest


def ulorl_padding(batch: Any, token_budget: int) -> dict[str, int]:
    """Real and padded tokens of one forward over ``batch`` (a ``TrainBatch``) in ulorl's micro-batches,
    and what the first-fit split would have padded it to."""
    from ulorl.train.batch import micro_batches, row_lengths

    lengths = row_lengths(batch)
    padded = sum(len(mb) * max(lengths[i] for i in mb) for mb in micro_batches(batch, token_budget))
    return {"train_real_tokens": sum(lengths), "train_padded_tokens": padded,
            "first_fit_padded_tokens": first_fit_padded_tokens(lengths, token_budget)}


class _Runner(Protocol):
    def info(self) -> dict[str, Any]: ...
    def serve(self, conn: Connection) -> None: ...


def _heldout_score(model: Any, tokenizer: Any, exp: Any, scorer: Any, max_len: int) -> dict[str, Any]:
    """avg@k of ``model`` on the first ``exp.eval.num_problems`` held-out problems of ``exp.data.heldout``,
    sampled by the hf engine at ``exp.eval``'s settings: the same evaluator for every system."""
    from ulorl.eval.runner import evaluate
    from ulorl.rollout.engines.hf import HFEngine
    from ulorl.rollout.engines.stop_ids import stop_token_ids
    from ulorl.rollout.types import SamplingParams
    from ulorl.train.prompts import load_items

    t0 = time.perf_counter()
    ev = exp.eval
    items = load_items(exp.data.heldout, exp.data, "heldout")[: ev.num_problems]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    try:
        engine = HFEngine(model, eos_token_id=stop_token_ids(model, tokenizer), pad_token_id=pad, batching="compact")
        res = evaluate(engine, tokenizer, items, k=ev.k, max_new_tokens=max_len, scorer=scorer, bench_name="heldout",
                       sampling=SamplingParams(temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k,
                                               seed=ev.seed), progress=False)
    finally:
        model.train(was_training)
    return {"avg_at_k": res.avg_at_k, "ci_low": res.ci_low, "ci_high": res.ci_high, "k": ev.k,
            "problems": res.num_problems, "response_len_mean": res.response_len_mean,
            "truncation_rate": res.truncation_rate, "eval_s": time.perf_counter() - t0}


class _Clock:
    """Wall and CPU seconds spent inside a wrapped callable since the last ``reset``."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def reset(self) -> None:
        self.wall = self.cpu = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - t0
                self.cpu += time.process_time() - c0
        return timed

    def split(self, wall: float, cpu: float) -> dict[str, float]:
        """A step of ``wall`` / ``cpu`` seconds: its rollout (the wrapped calls) and the rest (update)."""
        return {"wall_s": wall, "cpu_s": cpu, "rollout_s": self.wall, "rollout_cpu_s": self.cpu,
                "update_s": wall - self.wall, "update_cpu_s": cpu - self.cpu}


class UlorlRunner:
    """ulorl's ``Trainer`` (set up as ``ulorl-train`` does), stepped with ``train_step``."""

    def __init__(self, cfg: PeerConfig, system: System, seed: int, workdir: Path) -> None:
        from ulorl.config import config_from_dict
        from ulorl.train.trainer import Trainer

        self.cfg = cfg
        self.exp = config_from_dict(ulorl_experiment(cfg, system, seed, workdir), source="ulorl-bench peer")
        self.trainer = Trainer(self.exp, run_dir=workdir / "run", progress=False)
        self.trainer.setup()
        self.rollout_clock = _Clock()
        self.trainer.rollout_round = self.rollout_clock.wrap(self.trainer.rollout_round)  # type: ignore[method-assign]

    def info(self) -> dict[str, Any]:
        import torch

        return {"threads": torch.get_num_threads(), **process_memory_mb()}

    def step(self) -> dict[str, Any]:
        self.rollout_clock.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        res = self.trainer.train_step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        m = res.metrics
        trained = res.update is not None and res.update.updated
        padding = ulorl_padding(res.update.batch, self.exp.train.micro_batch_tokens) \
            if trained and res.update is not None and res.update.batch is not None else {}
        return {**self.rollout_clock.split(wall, cpu), **padding,
                "samples": int(m.get("train/samples", 0)) if trained else 0,
                "tokens": int(m.get("train/tokens", 0)) if trained else 0,
                "reward_mean": m.get("rollout/reward_mean"), **process_memory_mb()}

    def evaluate(self) -> dict[str, Any]:
        return _heldout_score(self.trainer.model, self.trainer.tokenizer, self.exp, self.trainer.scorer,
                              self.cfg.max_len)

    def serve(self, conn: Connection) -> None:
        while True:
            cmd = conn.recv()
            if cmd == "step":
                conn.send(("ok", self.step()))
            elif cmd == "eval":
                conn.send(("ok", self.evaluate()))
            elif cmd == "stop":
                self.trainer.close()
                conn.send(("ok", process_memory_mb()))
                return
            else:
                conn.send(("error", f"unknown command {cmd!r}"))


class TrlRunner:
    """TRL's ``GRPOTrainer`` on the same model path, prompt sequence and reward scorer."""

    def __init__(self, cfg: PeerConfig, system: System, seed: int, workdir: Path) -> None:
        try:
            import trl
            from datasets import Dataset
            from transformers import TrainerCallback
            from trl import GRPOConfig, GRPOTrainer
        except ImportError as exc:
            from ulorl.rollout.engines import MissingExtraError

            raise MissingExtraError(f"{PEER_EXTRA_MESSAGE} ({exc})") from exc
        import torch

        from ulorl.config import config_from_dict
        from ulorl.models.loading import load_tokenizer, resolve_model_path
        from ulorl.reward import RewardScorer
        from ulorl.train.prompts import PromptStream, load_items

        self.cfg = cfg
        self.trl_version = trl.__version__
        # the ulorl experiment of the same seed: its data section gives the prompt sequence and the eval
        self.exp = config_from_dict(ulorl_experiment(cfg, System("ulorl"), seed, workdir), source="ulorl-bench peer")
        torch.set_num_threads(cfg.threads)
        tokenizer = load_tokenizer(cfg.model)
        stream = PromptStream(load_items(self.exp.data.train, self.exp.data, "train"), tokenizer,
                              seed=self.exp.data.seed, shuffle=self.exp.data.shuffle)
        prompts = stream.take(cfg.steps * cfg.prompts)
        first = prompts[0]
        if tokenizer(text=[first.prompt_text])["input_ids"][0] != first.prompt_ids:
            raise RuntimeError("TRL tokenizes prompts with the tokenizer's special tokens and ulorl without them: "
                               "the two would not train on the same prompts")
        dataset = Dataset.from_list([{"prompt": p.prompt_text, "answer": p.answer, "problem": p.meta.get("problem", "")}
                                     for p in prompts])
        self.scorer = RewardScorer.from_config(self.exp.reward)
        acc: dict[str, Any] = {"samples": 0, "tokens": 0, "rewards": [], "train_padded_tokens": 0,
                               "train_real_tokens": 0}
        self._acc = acc
        self.rollout_clock = _Clock()
        eos_ids: list[int] = []

        def ulorl_reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                         answer: list[str], problem: list[str], **_: Any) -> list[Optional[float]]:
            """ulorl's reward: math-verify against the answer (with the problem text), 0 when the
            completion has no end token."""
            items = [(text, ref, not ids or ids[-1] not in eos_ids, prob)
                     for text, ids, ref, prob in zip(completions, completion_ids, answer, problem)]
            rewards: list[Optional[float]] = list(self.scorer.score(items))
            acc["rewards"].extend(rewards)
            return rewards

        runner = self

        class Baton(TrainerCallback):
            """Hands every training step to the coordinator: one "step" command, one answer."""

            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                runner._start_step()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                assert runner.conn is not None
                runner.conn.send(("ok", runner._end_step()))
                if state.global_step >= state.max_steps:
                    return
                cmd = runner.conn.recv()
                if cmd == "step":
                    runner._start_step()
                else:                       # the coordinator stops early: end train(), then serve cmd
                    runner.pending = cmd
                    control.should_training_stop = True

        self.conn: Optional[Connection] = None
        self.pending: Optional[str] = None
        self.trained = False
        trainer = GRPOTrainer(model=resolve_model_path(cfg.model), reward_funcs=ulorl_reward,
                              args=GRPOConfig(**trl_arguments(cfg, seed, workdir / "trl")),
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[Baton()])
        # typed Any: its rollout call is wrapped on the instance below (a measurement, not a change)
        self.trainer: Any = cast(Any, trainer)
        eos_ids.extend(int(e) for e in self.trainer.eos_token_ids)
        self.tokenizer = tokenizer
        generate_and_score = self.rollout_clock.wrap(self.trainer._generate_and_score_completions)

        def counted_generate_and_score(inputs: Any) -> Any:
            out = generate_and_score(inputs)
            acc["samples"] += int(out["completion_ids"].shape[0])
            acc["tokens"] += int(out["completion_mask"].sum())   # every completion token is trained
            # the training forward runs on [B, prompt width + completion width], padding included
            acc["train_padded_tokens"] += int(out["prompt_ids"].numel() + out["completion_ids"].numel())
            acc["train_real_tokens"] += int(out["prompt_mask"].sum() + out["completion_mask"].sum())
            return out

        self.trainer._generate_and_score_completions = counted_generate_and_score
        self._t0 = self._c0 = 0.0

    def info(self) -> dict[str, Any]:
        import torch

        return {"threads": torch.get_num_threads(), "trl": self.trl_version, **process_memory_mb()}

    def _start_step(self) -> None:
        self._acc.update(samples=0, tokens=0, rewards=[], train_padded_tokens=0, train_real_tokens=0)
        self.rollout_clock.reset()
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def _end_step(self) -> dict[str, Any]:
        wall, cpu = time.perf_counter() - self._t0, time.process_time() - self._c0
        a = self._acc
        rewards = a["rewards"]
        return {**self.rollout_clock.split(wall, cpu), "samples": a["samples"], "tokens": a["tokens"],
                "train_padded_tokens": a["train_padded_tokens"], "train_real_tokens": a["train_real_tokens"],
                "reward_mean": sum(rewards) / len(rewards) if rewards else None, **process_memory_mb()}

    def evaluate(self) -> dict[str, Any]:
        return _heldout_score(self.trainer.model, self.tokenizer, self.exp, self.scorer, self.cfg.max_len)

    def serve(self, conn: Connection) -> None:
        self.conn = conn
        while True:
            cmd, self.pending = (self.pending, None) if self.pending else (conn.recv(), None)
            if cmd == "step":
                if self.trained:
                    conn.send(("error", "TRL's steps all run inside one train() call; it has ended"))
                    continue
                self.trained = True
                self.trainer.train()        # Baton answers this step and every later "step"
            elif cmd == "eval":
                conn.send(("ok", self.evaluate()))
            elif cmd == "stop":
                self.scorer.close()
                conn.send(("ok", process_memory_mb()))
                return
            else:
                conn.send(("error", f"unknown command {cmd!r}"))


def worker_main(conn: Connection, payload: dict[str, Any]) -> None:
    """Entry point of a worker process: output to ``payload["log"]``, build the runner, serve commands."""
    log = open(payload["log"], "a", buffering=1)  # the process's stdout / stderr until it ends
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    try:
        cfg = PeerConfig(**payload["config"])
        system = System(**payload["system"])
        workdir = Path(payload["workdir"])
        workdir.mkdir(parents=True, exist_ok=True)
        runner_cls = TrlRunner if system.kind == "trl" else UlorlRunner
        runner: _Runner = runner_cls(cfg, system, int(payload["seed"]), workdir)
        conn.send(("ready", runner.info()))
        runner.serve(conn)
    except BaseException:  # noqa: BLE001 - the coordinator reports it with the system's name
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        try:
            conn.send(("error", text))
        except (OSError, EOFError):
            pass
    finally:
        conn.close()
