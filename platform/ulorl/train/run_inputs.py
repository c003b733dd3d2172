"""What a training run reads before any model work, checked by one function for the run and its dry run.

``Trainer.setup`` and ``ulorl-train --dry-run`` both call :func:`check_run_inputs`, so a dry run refuses
what the run would refuse: a ``model.name_or_path`` naming a local folder that does not exist (the
model loader's own test, ``ulorl.models.loading.missing_local_model``), then :func:`load_run_items`: a
missing data file, too few held-out problems for ``eval.final``, an ``eval.select_problems`` that leaves
no confirmation problems (each a ``ModelLoadError`` / ``ValueError`` / ``FileNotFoundError`` naming the
key and the fix)::

    items = check_run_inputs(cfg)          # RunItems(train, heldout, final) or an error naming the fix
"""

from __future__ import annotations

from dataclasses import dataclass

from ulorl.config import ExperimentConfig
from ulorl.data.types import PromptItem
from ulorl.eval.final import final_items
from ulorl.train.prompts import load_items


@dataclass(frozen=True)
class RunItems:
    """The problems of a run: its train split, the held-out split (empty without periodic or final
    evaluation) and the final evaluation's problems (empty without ``eval.final``)."""

    train: list[PromptItem]
    heldout: list[PromptItem]
    final: list[PromptItem]


def load_run_items(cfg: ExperimentConfig) -> RunItems:
    """The run's problems, every shortfall named before a model loads."""
    train = load_items(cfg.data.train, cfg.data, "train")
    heldout = load_items(cfg.data.heldout, cfg.data, "heldout") if cfg.eval.every or cfg.eval.final.k else []
    n_eval = min(len(heldout), cfg.eval.num_problems or len(heldout))
    # eval.final: problems no periodic eval scores (ulorl.eval.final)
    final = final_items(heldout, n_eval if cfg.eval.every else 0, cfg.eval.final.num_problems) \
        if cfg.eval.final.k else []
    if cfg.eval.every and cfg.eval.select_problems and cfg.eval.select_problems >= n_eval:
        raise ValueError(f"eval.select_problems ({cfg.eval.select_problems}) must be below the {n_eval} held-out "
                         f"problems evaluated ({cfg.data.heldout}): the rest are the confirmation problems")
    return RunItems(list(train), list(heldout), final)


def check_run_inputs(cfg: ExperimentConfig) -> RunItems:
    """:func:`load_run_items` after the model path check of the model loader: a ``model.name_or_path``
    naming a local folder that does not exist raises ``ModelLoadError`` (``ulorl.models.loading``); an
    embedded model whose asset is missing too."""
    from ulorl.models.loading import ModelLoadError, missing_local_model, resolve_model_path

    resolve_model_path(cfg.model.name_or_path)   # an embedded profile's missing asset: its build command
    missing = missing_local_model(cfg.model.name_or_path)
    if missing:
        raise ModelLoadError(f"model.name_or_path: {missing}")
    return load_run_items(cfg)
