"""JSONL prompt loading, dataset resolution and the prompt template."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from reward_fakes import CHAT_TEMPLATE, byte_tokenizer

from ulorl.data.jsonl import PACKAGED_DIR, DataError, load_jsonl_prompts, resolve_dataset
from ulorl.data.prompts import INSTRUCTION, build_prompt
from ulorl.data.types import PromptItem

# An external data folder (``$ULORL_DATA_DIR``, CI: ../shared/data) holds aime2025.jsonl, which is
# not packaged (no licence upstream); beyondaime and math_train_sample ship in the package.
DATA_DIR = Path(os.environ["ULORL_DATA_DIR"]) if os.environ.get("ULORL_DATA_DIR") else None


def _folder_for(name: str) -> Path:
    if (PACKAGED_DIR / f"{name}.jsonl").is_file():
        return PACKAGED_DIR
    if DATA_DIR is None or not (DATA_DIR / f"{name}.jsonl").is_file():
        pytest.skip(f"{name}.jsonl is not packaged (no licence upstream); set ULORL_DATA_DIR to a folder holding it")
    return DATA_DIR


def test_packaged_files_match_their_readme():
    """The packaged files are the ones whose sha256 the README beside them states."""
    import hashlib

    readme = (PACKAGED_DIR / "README.md").read_text()
    for name in ("beyondaime", "math_train_sample"):
        digest = hashlib.sha256((PACKAGED_DIR / f"{name}.jsonl").read_bytes()).hexdigest()
        assert digest in readme, name
    assert not (PACKAGED_DIR / "aime2025.jsonl").exists()


@pytest.mark.parametrize("name, rows", [("aime2025", 30), ("beyondaime", 100), ("math_train_sample", 2000)])
def test_shared_benchmarks(name, rows, monkeypatch):
    folder = _folder_for(name)
    if folder == PACKAGED_DIR:   # read by name with no data directory at all
        monkeypatch.delenv("ULORL_DATA_DIR", raising=False)
        assert resolve_dataset(name) == load_jsonl_prompts(PACKAGED_DIR / f"{name}.jsonl")
    items = resolve_dataset(name, str(folder))
    assert len(items) == rows
    assert all(it.problem and it.answer and not it.prompt for it in items)
    assert len({it.id for it in items}) == rows
    assert items == load_jsonl_prompts(folder / f"{name}.jsonl")  # by path too
    if name == "beyondaime":
        assert items[-1].answer == "33124147" and sum(int(it.answer) > 999 for it in items) == 44
    if name == "aime2025":
        assert items[0].id == "aime2025-I-01" and items[0].source.startswith("zai-org/")


def test_benchmark_from_env_and_missing_dir(monkeypatch, tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "aime2025.jsonl").write_text(GOOD + "\n")
    (own / "beyondaime.jsonl").write_text(GOOD + "\n")
    monkeypatch.setenv("ULORL_DATA_DIR", str(own))
    assert len(resolve_dataset("aime2025")) == 1
    assert len(resolve_dataset("beyondaime")) == 1          # a data folder wins over the packaged file
    monkeypatch.delenv("ULORL_DATA_DIR")
    with pytest.raises(DataError, match="ULORL_DATA_DIR"):
        resolve_dataset("aime2025")
    with pytest.raises(DataError) as err:
        resolve_dataset("beyondaime", str(tmp_path))
    assert str(tmp_path / "beyondaime.jsonl") in str(err.value) and "--data-dir" in str(err.value)


def test_unknown_missing_and_hf_specs(monkeypatch, tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'aime2024'"):
        resolve_dataset("aime2024", str(PACKAGED_DIR))
    for missing in (str(tmp_path / "nope.jsonl"), "nope.jsonl", str(tmp_path / "nope")):
        with pytest.raises(DataError, match="not found"):
            resolve_dataset(missing)
    with pytest.raises(DataError, match="is a directory"):
        resolve_dataset(str(tmp_path))
    # an HF id: never a download in tests (offline, or `datasets` not installed -> clear error)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="Hugging Face dataset id"):
        resolve_dataset("someone/some-math-set")


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


GOOD = json.dumps({"id": "a", "problem": "1+1?", "answer": "2"})


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        (json.dumps({"answer": "3"}), "'problem' is missing"),
        (json.dumps({"problem": "  ", "answer": "3"}), "'problem' is empty"),
        (json.dumps({"problem": "x"}), "'answer' is missing"),
        (json.dumps({"problem": "x", "answer": ""}), "'answer' is empty"),
        (json.dumps({"problem": "x", "answer": None}), "'answer' is empty"),
        (json.dumps({"id": "a", "problem": "x", "answer": "1"}), "duplicate id 'a' \\(first on line 1\\)"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, bad, message):
    p = _write(tmp_path, [GOOD, "", bad])
    with pytest.raises(DataError, match=message) as err:
        load_jsonl_prompts(p)
    assert f"{p}:3:" in str(err.value)  # the blank line 2 counts in numbering but is not a row


def test_row_fields(tmp_path):
    p = _write(tmp_path, [GOOD, json.dumps({"problem": " 2+2? ", "answer": 4, "level": 5})])
    a, b = load_jsonl_prompts(p)
    assert a == PromptItem(id="a", problem="1+1?", answer="2", source=str(p))
    assert (b.id, b.problem, b.answer, b.meta) == ("d-2", "2+2?", "4", {"level": 5})
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="no rows"):
        load_jsonl_prompts(empty)


def test_build_prompt():
    item = PromptItem(id="p", problem="What is 2+3?", answer="5")
    plain = build_prompt(item, None)
    assert plain.startswith("Problem: What is 2+3?") and "\\boxed{}" in plain and plain.endswith("Solution:")
    assert build_prompt(item, byte_tokenizer()) == plain  # no chat template -> plain text
    chat = build_prompt(item, byte_tokenizer(CHAT_TEMPLATE))
    assert chat == f"<|user|>What is 2+3?\n\n{INSTRUCTION}\n<|assistant|>"
    own = PromptItem(id="t", problem="3+4", answer="7", prompt="3+4=")
    assert build_prompt(own, byte_tokenizer(CHAT_TEMPLATE)) == "3+4="  # the task's own format
