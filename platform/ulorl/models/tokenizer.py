"""The embedded tokenizer, built in code (no download).

A byte-level BPE whose digits are always single tokens (so column arithmetic is learnable by a
tiny model) and whose merges are learned from text of the embedded task. It is deterministic:
the training corpus is generated from a fixed seed, and building twice gives the same vocabulary
and merges. Any UTF-8 text encodes (byte fallback through the 256-symbol byte alphabet) and
decodes back exactly.

    tok = build_tokenizer()                       # PreTrainedTokenizerFast, padding_side="left"
    tok.save_pretrained(d); AutoTokenizer.from_pretrained(d, padding_side="left")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN]
DEFAULT_VOCAB_SIZE = 320
VOCAB_RANGE = (258, 512)   # the 256 byte symbols and 2 special tokens, at least; the embedding's cap, at most
CORPUS_SEED = 12345
CORPUS_SIZE = 4000


def _corpus(n: int = CORPUS_SIZE, seed: int = CORPUS_SEED) -> list[str]:
    """Prompt + reference-solution texts of the embedded task (train split), for BPE merges."""
    from ulorl.data.task import make_split, reference_solution

    items = make_split("train", n, seed=seed)
    return [it.prompt + reference_solution(it) for it in items]


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, padding_side: str = "left") -> PreTrainedTokenizerFast:
    """Train the embedded byte-level BPE (digits split individually) and wrap it for transformers.

    ``vocab_size`` counts the 256 byte symbols, the special tokens and the merges (<= 512).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not VOCAB_RANGE[0] <= vocab_size <= VOCAB_RANGE[1]:
        raise ValueError(f"vocab_size must be in [{VOCAB_RANGE[0]}, {VOCAB_RANGE[1]}], got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        min_frequency=2,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side=padding_side,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
