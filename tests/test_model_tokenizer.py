"""The embedded tokenizer: built in code, deterministic, round-trips through save/load."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ulorl.models.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer()


TEXTS = [
    "Add: 23+45+67\n",
    "23+45=68\n68+67=135\n\\boxed{135}",
    "The answer is \\boxed{\\frac{1}{2}} (one half); ünïcödé ✓ 1234567890",
    "  leading spaces\tand tabs\n\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: PreTrainedTokenizerFast, text: str) -> None:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_special_tokens_and_size(tok: PreTrainedTokenizerFast) -> None:
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN
    assert tok.eos_token_id != tok.pad_token_id
    assert tok.padding_side == "left"
    assert len(tok) <= 512
    ids = tok("1+2", add_special_tokens=False)["input_ids"]
    assert tok.eos_token_id not in ids  # no special tokens added implicitly
    # the EOS id decodes to nothing when special tokens are skipped
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "1+2"


def test_digits_are_single_tokens(tok: PreTrainedTokenizerFast) -> None:
    toks = tok.tokenize("1234+56=1290")
    assert toks == ["1", "2", "3", "4", "+", "5", "6", "=", "1", "2", "9", "0"]
    boxed = tok.tokenize("\\boxed{135}")
    assert "".join(boxed) == "\\boxed{135}" and boxed[-4:] == ["1", "3", "5", "}"]


def test_deterministic(tok: PreTrainedTokenizerFast) -> None:
    again = build_tokenizer()
    assert again.get_vocab() == tok.get_vocab()
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_save_load_round_trip(tok: PreTrainedTokenizerFast, tmp_path) -> None:
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, padding_side="left")
    assert loaded.get_vocab() == tok.get_vocab()
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert loaded.padding_side == "left"
    for text in TEXTS:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    batch = loaded(["1+2\n", "10+20+30\n"], padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id  # left padding
    assert batch["attention_mask"][0][0] == 0


def test_vocab_size_checked() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(vocab_size=1000)
