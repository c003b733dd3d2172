"""Test helpers for the judge and the model-based cleaning filters.

``byte_tokenizer()`` is a real ``transformers`` tokenizer (byte-level BPE with no merges, built in
code): every UTF-8 text round-trips. ``TextScriptedEngine`` is a fake ``Engine`` whose reply to a
request is a scripted *text* (a function of the decoded prompt and the request seed) returned as
token ids + EOS -- the scripted answer is the point of these tests.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ulorl.rollout.types import GenerationRequest, GenerationResult, SamplingParams

EOS = "<eos>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer(chat_template: Optional[str] = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=257, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["a"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
    if chat_template:
        fast.chat_template = chat_template
    return fast


class TextScriptedEngine:
    """Fake ``ulorl.rollout.types.Engine``: ``reply(prompt_text, request) -> text``.

    ``truncate_at`` cuts replies to that many tokens with ``finish_reason="length"``.
    ``calls`` records ``(len(requests), sampling)`` per ``generate`` call.
    """

    def __init__(
        self, tokenizer: Any, reply: Callable[[str, GenerationRequest], str], truncate_at: Optional[int] = None
    ) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.truncate_at = truncate_at
        self.eos_token_id = tokenizer.convert_tokens_to_ids(EOS)
        self.policy_version = 0
        self.calls: list[tuple[int, SamplingParams]] = []
        self.prompts: list[str] = []

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        self.calls.append((len(requests), sampling))
        out = []
        for r in requests:
            prompt = self.tokenizer.decode(r.prompt_ids + r.prefix_ids)
            self.prompts.append(prompt)
            ids = self.tokenizer.encode(self.reply(prompt, r), add_special_tokens=False)
            limit = min(r.max_new_tokens, self.truncate_at or r.max_new_tokens)
            if len(ids) + 1 > limit:
                ids, reason = ids[:limit], "length"
            else:
                ids, reason = ids + [self.eos_token_id], "eos"
            out.append(GenerationResult(r.request_id, ids, [0.0] * len(ids), reason))
        return out

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.policy_version = version
