"""``ulorl-data warmstart`` refuses a model shape whose training state alone does not fit in the memory the
machine has (``--hidden-size 65536`` used to go on to an allocator failure or an OOM kill): the flags, the
model's parameters, the memory it needs and has, the shipped shape to compare; exit 2, nothing built. The
parameter count it uses is the real model's, for the dense and the MoE shape."""

from __future__ import annotations

import dataclasses

import pytest

from ulorl.cli import data as data_cli
from ulorl.models import warmstart
from ulorl.models.tiny import DEFAULT_TINY, MoeSpec, build_tiny_model, count_parameters
from ulorl.models.tokenizer import build_tokenizer


@pytest.mark.parametrize("spec, moe", [
    (dataclasses.replace(DEFAULT_TINY, hidden_size=64, intermediate_size=100, num_hidden_layers=3), None),
    (dataclasses.replace(DEFAULT_TINY, hidden_size=96), MoeSpec(num_experts=3, num_experts_per_tok=1,
                                                                moe_intermediate_size=40)),
])
def test_the_estimate_is_the_built_models_parameter_count(spec, moe):
    model = build_tiny_model(build_tokenizer(), spec, moe=moe)
    assert data_cli.estimated_parameters(spec, model.config.vocab_size, moe) == count_parameters(model)


def _never(*args, **kwargs):
    raise AssertionError("the warm start was started")


def test_a_shape_that_cannot_fit_is_refused_before_anything_is_built(monkeypatch, capsys):
    monkeypatch.setattr(warmstart, "ensure_warmstart", _never)
    monkeypatch.setattr(warmstart, "warmstart_dir", _never)
    assert data_cli.main(["warmstart", "--hidden-size", "65536", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ulorl-data warmstart: error: --hidden-size 65536: a model of this shape has 257.7 B "
                          "parameters; warm-starting it needs at least 3,840.6 GiB of memory (16 bytes a parameter: "
                          "fp32 weights, gradients and AdamW's two moments, activations not counted) and this machine "
                          "has ")
    assert err.endswith("GiB available; give a smaller shape (the shipped model: --hidden-size 128 --intermediate-size "
                        "512 --layers 4, 1.07 M parameters)")


def test_the_bound_is_the_memory_available(monkeypatch):
    args = data_cli.build_parser().parse_args(["warmstart", "--layers", "8"])
    need = data_cli.estimated_parameters(dataclasses.replace(DEFAULT_TINY, num_hidden_layers=8), 320) * 16
    monkeypatch.setattr(data_cli, "available_memory_bytes", lambda: need)
    assert data_cli.shape_memory_problem(args) is None
    monkeypatch.setattr(data_cli, "available_memory_bytes", lambda: need - 1)
    assert data_cli.shape_memory_problem(args).startswith("--layers 8: a model of this shape has 2.1 M parameters")
    assert data_cli.shape_memory_problem(data_cli.build_parser().parse_args(["warmstart"])) is None   # shipped shape
