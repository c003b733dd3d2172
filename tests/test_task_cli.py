"""``ulorl-data``: help, sample, and ``stats --json`` on the shipped model (small n)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ulorl.cli.data import main

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ulorl.cli.data", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_help_lists_subcommands(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for sub in ("warmstart", "stats", "sample"):
        assert sub in out


def test_sample_json(capsys) -> None:
    assert main(["sample", "--n", "2", "--seed", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["items"]) == 2
    it = res["items"][0]
    assert it["prompt"].startswith("Add: ") and it["solution"].endswith(f"\\boxed{{{it['answer']}}}")


def test_bad_flag_value_is_named(capsys) -> None:
    assert main(["stats", "--n", "0"]) == 2
    assert "--n" in capsys.readouterr().err
    assert main(["stats", "--top-p", "1.5"]) == 2
    assert "--top-p" in capsys.readouterr().err


def test_stats_json_lengths_only(capsys) -> None:
    assert main(["stats", "--json", "--n", "64", "--no-accuracy"]) == 0
    res = json.loads(capsys.readouterr().out)
    lp = res["length_percentiles"]
    assert lp["p50"] <= lp["p90"] <= lp["max"] and res["n"] == 64
    assert sum(res["bucket_counts"].values()) == 64


def test_stats_json_subprocess() -> None:
    """The documented command prints exactly one JSON object on stdout; progress goes to stderr."""
    r = _run("stats", "--json", "--n", "16", "--seed", "0", "--threads", "1")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)  # the whole stdout is one JSON object
    assert res["n"] == 16 and res["seed"] == 0
    assert set(res["length_percentiles"]) >= {"p50", "p90", "max"}
    assert 0.0 <= res["accuracy"] <= 1.0
    accs = [a for a in res["accuracy_by_length"].values() if a is not None]
    assert accs and all(0.0 <= a <= 1.0 for a in accs)
    assert "sampled" in r.stderr


def test_response_form_splits_guesses_from_derivations() -> None:
    from ulorl.cli.data import response_form

    assert response_form("\\boxed{68}") == "guess"
    assert response_form("68") == "guess"                      # no line, no box: still no derivation
    assert response_form("23+45=68\n\\boxed{68}") == "derivation"
    assert response_form("23 + 45 = 68, 68+67=135\n\\boxed{135}") == "derivation"


def test_choice_profile_as_shipped_meets_its_targets(capsys) -> None:
    """The shipped choice model keeps entropy, sits in the accuracy band and reaches the tail
    (the README's command: 256 held-out items, seed 0)."""
    assert main(["stats", "--profile", "choice", "--json", "--n", "256", "--seed", "0", "--threads", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["profile"] == "choice" and res["sampling"]["max_new_tokens"] == 192
    assert res["sampling_entropy"] >= 0.2 and 0.2 <= res["accuracy"] <= 0.8
    assert set(res["accuracy_by_length"]) == {"<=32", "33-64", "65-128"}  # no reference is longer
    assert min(res["accuracy_by_length"].values()) >= 0.2
    forms = res["accuracy_by_form"]
    assert forms["guess"]["n"] + forms["derivation"]["n"] == 256
    assert forms["derivation"]["accuracy"] > (forms["guess"]["accuracy"] or 0.0)  # length buys accuracy


def test_warmstart_shape_flags_build_that_shape(tmp_path, monkeypatch, capsys) -> None:
    """--hidden-size / --layers / --vocab-size reach the built model and its tokenizer (and the cache key)."""
    monkeypatch.setenv("ULORL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "narrow"
    assert main(["warmstart", "--profile", "choice", "--hidden-size", "64", "--layers", "2", "--vocab-size", "258",
                 "--max-steps", "2", "--eval-every", "2", "--threads", "1", "--quiet", "--json",
                 "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (64, 256, 2)
    assert cfg["vocab_size"] == 320  # 258 tokens padded up to a multiple of 64
    from ulorl.models.loading import load_tokenizer
    assert len(load_tokenizer(str(out))) == 258  # bytes and the two special tokens: no merge
    from ulorl.models.warmstart import profile_config
    assert res["cache_key"] != profile_config("choice").cache_key()


def test_warmstart_bad_shape_flags_are_named(capsys) -> None:
    assert main(["warmstart", "--hidden-size", "66"]) == 2
    assert "--hidden-size" in capsys.readouterr().err
    assert main(["warmstart", "--layers", "0"]) == 2
    assert "--layers" in capsys.readouterr().err
    assert main(["warmstart", "--vocab-size", "600"]) == 2
    assert "--vocab-size" in capsys.readouterr().err
