"""Generative verifier (PAPER.md section 4): a model judges answer equivalence.

A second opinion where the rules abstain (``ulorl.reward.scorer``: the rule check said "not
equivalent" and one side is prose or a number with units, which no rule reads: ``27cm`` vs
``0.27m``, ``1/2`` vs ``one half``, "No, it is not possible" against a statement, descriptions of
a set or a strategy). The problem text, when known, is in the prompt (option texts, what is asked).
The judge talks to any ``ulorl.rollout.types.Engine`` (token ids in,
token ids out) through a tokenizer with ``encode`` / ``decode`` (and ``apply_chat_template`` when
it has a chat template). Replies are parsed strictly: the last non-empty line must be exactly
``VERDICT: YES`` or ``VERDICT: NO``; anything else is *unparseable*, counted, and treated as not
equivalent. Verdicts are cached per ``(pred, ref, problem)`` (decoding is greedy, so a repeat would
give the same reply). ``timeout_s`` bounds one engine call: a call that overruns it answers "not
equivalent" for its pairs and switches the judge off for the rest of the run (``timeouts``; the
engine may still be busy, so it is not asked again). Off when no judge model is configured
(``judge_from_config`` -> None).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

from ulorl.rollout.types import Engine, GenerationRequest, SamplingParams

PROBLEM_LINE = "Problem: {problem}\n"  # only when the problem is known
MAX_PROBLEM_CHARS = 2000
JUDGE_INSTRUCTION = (
    "You are checking the final answer of a math problem against the reference answer.\n"
    "Decide whether the predicted answer and the reference answer are mathematically equivalent: "
    "the same value or object, possibly written differently or in different units "
    "(for example 27 cm and 0.27 m are equivalent; 1/2 and one half are equivalent; "
    "27 and 28 are not).\n\n"
    "{problem}"
    "Predicted answer: {pred}\n"
    "Reference answer: {ref}\n\n"
    "You may give one short sentence of justification. The last line of your reply must be "
    "exactly VERDICT: YES or VERDICT: NO"
)


def parse_verdict(text: str) -> Optional[bool]:
    """True / False for a reply whose last non-empty line is ``VERDICT: YES`` / ``VERDICT: NO``;
    None (unparseable) for anything else."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1]
    if last == "VERDICT: YES":
        return True
    if last == "VERDICT: NO":
        return False
    return None


def render_chat(tokenizer: Any, content: str) -> Optional[str]:
    """``content`` as one user turn through the tokenizer's chat template, or None if it has none."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without adding special tokens (a chat template already has them)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # a plain encode(text) tokenizer
        ids = tokenizer.encode(text)
    return list(ids)


def decode_ids(tokenizer: Any, ids: list[int], eos_token_id: Optional[int]) -> str:
    """Text of generated ``ids``, with a trailing EOS removed and special tokens skipped."""
    if eos_token_id is not None:
        ids = [t for t in ids if t != eos_token_id]
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except TypeError:
        return tokenizer.decode(ids)


class GenerativeJudge:
    """Ask a model whether ``pred`` and ``ref`` are equivalent; strict parsing, cached, counted.

    ``max_answer_chars``: longer answers are not sent (counted in ``skipped_long``, not equivalent)
    so a runaway response cannot blow up the judge's prompt.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        max_new_tokens: int = 64,
        sampling: Optional[SamplingParams] = None,
        max_answer_chars: int = 1000,
        timeout_s: Optional[float] = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.sampling = sampling or SamplingParams(temperature=1.0, greedy=True, seed=0)
        self.max_answer_chars = int(max_answer_chars)
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 (or None: no bound), got {timeout_s}")
        self.timeout_s = timeout_s
        self.disabled = False
        self._cache: dict[tuple[str, str, str], bool] = {}
        self._lock = threading.Lock()
        self._next_id = 0
        self._stats = {"calls": 0, "cache_hits": 0, "yes": 0, "no": 0, "unparseable": 0, "skipped_long": 0,
                       "timeouts": 0, "skipped_off": 0}

    @property
    def stats(self) -> dict[str, int]:
        """``calls`` (engine requests), ``cache_hits``, ``yes``, ``no``, ``unparseable``,
        ``skipped_long``, ``timeouts`` (engine calls over ``timeout_s``), ``skipped_off`` (pairs not
        sent because an earlier call timed out)."""
        with self._lock:
            return dict(self._stats)

    def prompt_text(self, pred: str, ref: str, problem: str = "") -> str:
        """The judge's prompt for one pair (the problem, cut to ``MAX_PROBLEM_CHARS``, when given)."""
        line = PROBLEM_LINE.format(problem=problem.strip()[:MAX_PROBLEM_CHARS]) if problem.strip() else ""
        content = JUDGE_INSTRUCTION.format(pred=pred, ref=ref, problem=line)
        chat = render_chat(self.tokenizer, content)
        return chat if chat is not None else content + "\n"

    def judge(self, pred: str, ref: str, problem: str = "") -> bool:
        """True iff the judge says ``VERDICT: YES`` for this pair."""
        return self.judge_many([(pred, ref, problem)])[0]

    def judge_many(self, pairs: Sequence[tuple[str, ...]]) -> list[bool]:
        """Verdicts for ``(pred, ref)`` or ``(pred, ref, problem)`` items, in order; one engine call for
        all uncached ones (bounded by ``timeout_s``)."""
        keys = [(p[0], p[1], (p[2] if len(p) > 2 and p[2] else "")) for p in pairs]
        with self._lock:
            st = self._stats
            todo: list[tuple[str, str, str]] = []
            seen: set[tuple[str, str, str]] = set()
            for key in keys:
                pred, ref, _ = key
                if key in self._cache:
                    st["cache_hits"] += 1
                elif len(pred) > self.max_answer_chars or len(ref) > self.max_answer_chars:
                    st["skipped_long"] += 1
                elif key in seen:
                    st["cache_hits"] += 1
                elif self.disabled:
                    st["skipped_off"] += 1
                else:
                    seen.add(key)
                    todo.append(key)
            if todo:
                requests = []
                for pred, ref, problem in todo:
                    requests.append(
                        GenerationRequest(
                            request_id=self._next_id,
                            prompt_ids=encode_text(self.tokenizer, self.prompt_text(pred, ref, problem)),
                            prefix_ids=[],
                            max_new_tokens=self.max_new_tokens,
                            seed=self.sampling.seed,
                        )
                    )
                    self._next_id += 1
                results = self._generate(requests)
                if results is None:  # over the time bound: "not equivalent", and the judge is off from now on
                    st["timeouts"] += 1
                    self.disabled = True
                    return [self._cache.get(k, False) for k in keys]
                eos = self.engine.eos_token_id
                for pair, res in zip(todo, results):
                    st["calls"] += 1
                    verdict = parse_verdict(decode_ids(self.tokenizer, res.token_ids, eos))
                    if verdict is None:
                        st["unparseable"] += 1
                    else:
                        st["yes" if verdict else "no"] += 1
                    self._cache[pair] = bool(verdict)
            return [self._cache.get(k, False) for k in keys]

    def _generate(self, requests: list[GenerationRequest]) -> Optional[list[Any]]:
        """``engine.generate(requests)``, or None when it does not return within ``timeout_s`` (it is
        left running in a daemon thread: an engine call cannot be interrupted from outside)."""
        if self.timeout_s is None:
            return self.engine.generate(requests, self.sampling)
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["out"] = self.engine.generate(requests, self.sampling)
            except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
                box["err"] = exc

        worker = threading.Thread(target=call, name="ulorl-judge", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            return None
        if "err" in box:
            raise box["err"]
        return box["out"]


def judge_from_config(
    cfg: Any, load_engine: Callable[[str], tuple[Engine, Any]]
) -> Optional[GenerativeJudge]:
    """A judge for ``RewardConfig`` ``cfg``, or None when ``cfg.judge_model`` is unset (judge off).

    ``load_engine(name_or_path) -> (engine, tokenizer)`` is supplied by the caller (the trainer
    owns model loading and engine placement).
    """
    if not getattr(cfg, "judge_model", None):
        return None
    engine, tokenizer = load_engine(cfg.judge_model)
    return GenerativeJudge(engine, tokenizer, max_new_tokens=cfg.judge_max_new_tokens,
                           timeout_s=getattr(cfg, "judge_timeout_s", None))
