"""The names the readers of tracked runs share (``ulorl.tracking.schema``): the per-problem artifact,
finding a run's last periodic one, params read back from their logged strings, and the one table of
config keys the dashboard, the figures and the sweeps derive their key lists from."""

from __future__ import annotations

from ulorl.tracking import schema


def test_per_problem_artifact_names_eval_and_periodic_csvs():
    assert schema.per_problem_artifact("aime2025") == "eval/aime2025_per_problem.csv"
    assert schema.per_problem_artifact("heldout", 7) == "eval/heldout_per_problem_step_000007.csv"


def test_last_per_problem_artifact_is_the_highest_step_of_that_bench():
    paths = [schema.per_problem_artifact("heldout", 20), schema.per_problem_artifact("heldout", 100),
             schema.per_problem_artifact("heldout_select", 300), schema.per_problem_artifact("heldout"),
             "eval/heldout_per_problem_step_x.csv", schema.per_problem_artifact("heldout", 9)]
    assert schema.per_problem_steps(paths) == [("heldout", 20), ("heldout", 100), ("heldout_select", 300),
                                               ("heldout", 9)]
    assert schema.last_per_problem_artifact(paths, "heldout") == "eval/heldout_per_problem_step_000100.csv"
    last_select = schema.last_per_problem_artifact(paths, "heldout_select")
    assert last_select == "eval/heldout_select_per_problem_step_000300.csv"
    assert schema.last_per_problem_artifact(paths, "aime2025") is None


def test_params_read_back_from_their_logged_strings():
    assert schema.int_param("4") == 4 and schema.int_param("4.0") == 4
    assert schema.int_param(None) is None and schema.int_param("abc") is None
    assert schema.float_param("0.25") == 0.25 and schema.float_param(None) is None
    assert schema.typed_param("3") == 3 and schema.typed_param("0.5") == 0.5
    assert schema.typed_param("dynamic") == "dynamic" and schema.typed_param(None) is None


def test_key_lists_derive_from_one_table():
    keys = [k.key for k in schema.RUN_KEYS]
    assert len(set(keys)) == len(keys)
    legends = [k.legend for k in schema.RUN_KEYS if k.legend]
    assert len(set(legends)) == len(legends)                     # one order for the figure legends
    labels = list(schema.PARAM_LABELS.values())
    assert len(set(labels)) == len(labels) and list(schema.PARAM_LABELS) == list(schema.KEY_PARAMS)
    assert schema.DISTINGUISHING_KEYS[:2] == ("algo.is_mode", "algo.mpt.mode")   # the figures' primary params first
    assert set(schema.SEED_KEYS) <= set(schema.DISTINGUISHING_KEYS)
    assert not set(schema.SEED_KEYS) & set(schema.KEY_PARAMS)
