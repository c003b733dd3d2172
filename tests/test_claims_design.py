"""The evaluation design the verdicts read (ulorl.eval.final, eval.final): one evaluation after the last
step, with its own k, on held-out problems no periodic eval scores; enlarging the held-out split for it
leaves the training data and the periodic problems as they were; the paired seeds are written in the
sweep file before it runs. Real trainings on a sqlite MLflow store; claims and the sweep verdict read
the final evaluation when every paired run has it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow_store import migrated_empty_db, store_uri_from_template
from test_claims import Store, _one

from ulorl.config import ConfigError, DataConfig, TaskConfig, load_experiment
from ulorl.data.types import PromptItem
from ulorl.eval.final import final_bench, final_items
from ulorl.report import claims as C
from ulorl.report.results import ResultsStore, export_results, read_records
from ulorl.report.store import RunStore
from ulorl.sweep import ranking
from ulorl.sweep.spec import load_sweep
from ulorl.tracking import schema
from ulorl.train.prompts import PromptStream, load_items

ROOT = Path(__file__).resolve().parents[1]
CHOICE = ROOT / "experiments" / "quickstart_choice.yaml"


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


def _item(i: int, prompt: str) -> PromptItem:
    return PromptItem(id=f"h{i}", problem=prompt, answer="0", prompt=prompt)


# ----------------------------------------------------------------------------- which problems


def test_final_items_skip_the_periodic_problems_and_repeats() -> None:
    items = [_item(i, p) for i, p in enumerate(["a", "b", "c", "a", "d", "d", "e", "b", "f"])]
    # periodic = a, b, c; after them: a (periodic), d, d (repeat), e, b (periodic), f
    assert [it.id for it in final_items(items, periodic=3, n=3)] == ["h4", "h6", "h8"]
    assert [it.id for it in final_items(items, periodic=0, n=3)] == ["h0", "h1", "h2"]
    with pytest.raises(ValueError, match=r"only 3 held-out problems after the first 3 .*data\.task\.num_heldout"):
        final_items(items, periodic=3, n=4)
    assert final_bench("heldout") == "heldout_final" == C.FINAL


@pytest.mark.parametrize("profile", ["embedded", "embedded:choice"])
def test_enlarging_the_heldout_split_leaves_training_and_periodic_problems_unchanged(profile: str) -> None:
    small = DataConfig(train=profile, heldout=profile, task=TaskConfig(num_train=2000, num_heldout=256))
    large = small.model_copy(update={"task": TaskConfig(num_train=2000, num_heldout=1024)})
    train_small, train_large = load_items(profile, small, "train"), load_items(profile, large, "train")
    # the same training items in the same order (the prompt order: the next test)
    assert [(it.id, it.prompt, it.answer) for it in train_small] == \
        [(it.id, it.prompt, it.answer) for it in train_large]
    held_small, held_large = load_items(profile, small, "heldout"), load_items(profile, large, "heldout")
    assert held_large[:256] == held_small                   # the periodic evals' problems: a prefix
    fresh = final_items(held_large, periodic=256, n=512)
    periodic = {it.prompt for it in held_small}
    assert len({it.prompt for it in fresh}) == 512 and not periodic & {it.prompt for it in fresh}
    assert not {it.prompt for it in fresh} & {it.prompt for it in train_large}   # held out from training


def test_prompt_order_does_not_depend_on_the_heldout_size() -> None:
    from ulorl.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    orders = []
    for n in (256, 1024):
        data = DataConfig(train="embedded:choice", heldout="embedded:choice", task=TaskConfig(num_train=300,
                                                                                           num_heldout=n))
        stream = PromptStream(load_items("embedded:choice", data, "train"), tok, seed=5)
        orders.append([r.prompt_text for r in stream.take(450)])      # into the second epoch
    assert orders[0] == orders[1]


def test_final_eval_config_is_documented_and_checked() -> None:
    cfg = load_experiment(CHOICE, ["eval.final.k=16", "data.task.num_heldout=1024"])
    assert (cfg.eval.final.k, cfg.eval.final.num_problems) == (16, 512)
    assert load_experiment(CHOICE).eval.final.k == 0                       # off unless a sweep asks for it
    with pytest.raises(ConfigError, match=r"eval\.final\.k needs eval\.num_problems"):
        load_experiment(CHOICE, ["eval.final.k=16", "eval.num_problems=null"])
    from ulorl.config_doc import explain

    assert "no periodic eval scores" in explain("eval.final.num_problems")


# ----------------------------------------------------------------------------- a real run


def test_trainer_logs_one_final_evaluation_the_results_files_keep(tmp_path: Path, empty_db: Path) -> None:
    """Two real 2-step trainings (random-init model of the choice profile's architecture, masking off and
    static, one seed), periodic eval on 4 held-out problems (k = 1), final eval k = 2 on 5 others, tagged
    as a sweep: the final eval
    is logged once, after the last step, on problems the periodic one never scored; the results file
    keeps it; the claims read it."""
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.train.trainer import Trainer

    model_dir = tmp_path / "tiny"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    uri = store_uri_from_template(tmp_path, empty_db)
    common = [f"model.name_or_path={model_dir}", "train.max_steps=2", "rollout.max_response_len=32",
              "rollout.segments=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "eval.every=2",
              "eval.num_problems=4", "eval.k=1", "eval.final.k=2", "eval.final.num_problems=5",
              "data.task.num_heldout=16", "algo.dynamic_sampling=false", "tracking.paper_ref=fig4",
              "train.threads=1", "train.checkpoint_every=2"]
    ids = {}
    for mode in ("off", "static"):
        over = common + [f"algo.mpt.mode={mode}", f"train.output_dir={tmp_path / 'runs' / mode}"]
        ids[mode, 0] = Trainer(load_experiment(CHOICE, over), tracking_uri=uri, progress=False,
                               extra_tags={schema.SWEEP_TAG: "choice_design", schema.SEED_TAG: "0"}).run().run_id
    store = RunStore.open(uri)
    rid = ids["off", 0]
    key = f"eval/{C.FINAL}/avg_at_k"
    steps, values = store.history(rid, key)
    assert steps == [2] and 0.0 <= values[0] <= 1.0                    # once, after the last step
    assert store.history(rid, "time/final_eval_s")[0] == [2]
    periodic, final = store.per_problem(rid, 2, "heldout"), store.per_problem(rid, 2, C.FINAL)
    assert len(periodic) == 4 and len(final) == 5 and not set(periodic) & set(final)
    assert all(v in (0.0, 0.5, 1.0) for v in final.values())            # k = 2
    assert values[0] == pytest.approx(sum(final.values()) / 5)
    # the results file keeps the final evaluation: curve, per-problem counts out of k = 2, its seconds
    out = export_results(store, tmp_path / "results")
    rec = next(r for r in read_records(out["choice_design"]["file"]) if r["run_id"] == rid)
    assert rec["per_problem"][C.FINAL]["steps"]["2"]["k"] == 2 and key in rec["curves"]
    assert rec["metrics"]["time/final_eval_s"] > 0
    files = ResultsStore.open(tmp_path / "results")
    assert files.per_problem(rid, 2, C.FINAL) == final
    # the claims read the final evaluation (every paired run has it), over its 5 problems
    acc = _one(C.evaluate_claims(files), "fig4_heldout")
    assert acc.bench == C.FINAL and acc.seeds == 1
    want = files.history(ids["static", 0], key)[1][-1] - files.history(ids["off", 0], key)[1][-1]
    assert [p["diff"] for p in acc.per_seed] == pytest.approx([want])
    assert C.run_value(files, files.get(rid), C.M_HELDOUT, bench=C.FINAL).scores == final
    # (a random-init policy earns no reward in 2 steps, so masking changes nothing: the arms are identical)
    assert acc.verdict == C.ARMS_IDENTICAL


# ----------------------------------------------------------------------------- claims and the sweep verdict


def test_claims_read_the_final_evaluation_only_when_every_paired_run_has_it(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    parent = st.parent("choice_mpt_mode")
    kw = {"sweep": "choice_mpt_mode", "parent": parent}
    for s, gain in enumerate((0.25, 0.5, 0.75)):
        off = {f"q{i}": 0.5 for i in range(4)}
        st.run("fig4", {"algo.mpt.mode": "off"}, s, heldout={150: 0.5}, per_problem={150: {"p": 0.5}},
               final={150: off}, **kw)
        st.run("fig4", {"algo.mpt.mode": "static"}, s, heldout={150: 0.9}, per_problem={150: {"p": 0.9}},
               final={150: {**off, "q0": 0.5 + gain}}, **kw)
    r = _one(C.evaluate_claims(RunStore.open(st.uri)), "fig4_heldout")
    assert r.bench == C.FINAL and r.problems == 4
    assert [p["diff"] for p in r.per_seed] == pytest.approx([0.0625, 0.125, 0.1875])   # gain / 4 problems
    assert any("final evaluation" in n for n in r.notes)
    # one static run without it: the periodic evals for every pair, and the row says why
    (tmp_path / "b").mkdir()
    st2 = Store(tmp_path / "b", empty_db)
    p2 = st2.parent("choice_mpt_mode")
    for s in range(3):
        st2.run("fig4", {"algo.mpt.mode": "off"}, s, heldout={150: 0.5}, final={150: {"q": 0.5}},
                sweep="choice_mpt_mode", parent=p2)
        st2.run("fig4", {"algo.mpt.mode": "static"}, s, heldout={150: 0.5 + 0.1 * s},
                final=None if s == 2 else {150: {"q": 1.0}}, sweep="choice_mpt_mode", parent=p2)
    r2 = _one(C.evaluate_claims(RunStore.open(st2.uri)), "fig4_heldout")
    assert r2.bench == "heldout" and [p["diff"] for p in r2.per_seed] == pytest.approx([0.0, 0.1, 0.2])
    assert any("5 of 6 paired runs have the final evaluation" in n for n in r2.notes)


def test_sweep_verdict_judges_on_the_final_evaluation() -> None:
    def trial(run_id: str, role: str, off: int, final_gain: float, confirm_gain: float) -> ranking.Trial:
        return ranking.Trial(run_id, run_id, run_id, role, off, "FINISHED", 0.5 if role == "search" else None, 150.0,
                             scores={"p0": 0.5}, confirm={"c0": 0.5 + confirm_gain},
                             final={f"f{i}": 0.5 + (final_gain if i == 0 else 0.0) for i in range(4)})
    trials = [trial("best", "search", 0, 0.0, 0.0)]
    trials += [trial(f"re{s}", "rerun", s, g, -0.25) for s, g in ((1, 0.25), (2, 0.5), (3, 0.25))]
    trials += [trial(f"b{s}", "baseline", s, 0.0, 0.0) for s in range(4)]
    v = ranking.verdict(trials)
    assert v.part == "final" and [p["problems"] for p in v.per_seed] == [4, 4, 4]
    assert [p["diff"] for p in v.per_seed] == pytest.approx([0.0625, 0.125, 0.0625])  # not the confirm part's
    assert "final evaluation" in v.line


# ----------------------------------------------------------------------------- seeds written before the run


def _final_sweeps() -> list[Path]:
    return [p for p in sorted((ROOT / "sweeps" / "choice").glob("*.yaml"))
            if "eval.final.k" in (yaml.safe_load(p.read_text()).get("overrides") or {})]


def test_final_design_sweeps_write_their_paired_seeds_and_results_hold_no_others() -> None:
    """Every choice sweep under the design names its seed offsets in the file (fixed before it runs),
    scores 512 new problems at k = 16, and its committed results hold only those offsets, each arm on
    the same ones."""
    sweeps = _final_sweeps()
    assert ROOT / "sweeps" / "choice" / "output_length.yaml" in sweeps
    for path in sweeps:
        raw = yaml.safe_load(path.read_text())
        assert "seed_offsets" in raw and "repeats" not in raw, path.name
        spec, _, base = load_sweep(path)
        cfg = load_experiment(CHOICE, [f"{k}={v}" for k, v in spec.overrides.items()])
        assert (cfg.eval.final.k, cfg.eval.final.num_problems) == (16, 512), path.name
        assert cfg.data.task.num_heldout >= 1024, path.name
        declared = set(spec.offsets)
        records = read_records(ROOT / "experiments" / "results" / f"{spec.name}.jsonl")
        by_arm: dict[str, set[int]] = {}
        for rec in records:
            by_arm.setdefault(rec["tags"].get(schema.VARIANT_TAG, ""), set()).add(int(rec["tags"][schema.SEED_TAG]))
        for arm, offsets in by_arm.items():
            assert offsets <= declared, f"{spec.name} {arm}: seed offsets {sorted(offsets - declared)} not declared"


# ----------------------------------------------------------------------------- how much is evaluation noise


def test_sampling_variance_and_the_evaluation_noise_share(tmp_path: Path, empty_db: Path) -> None:
    from ulorl.eval.paired import sampling_variance

    # sum_i p(1 - p) / (k - 1) / P^2: [1, 0, 0.5, 0.25] at k = 4 -> (0.25 + 0.1875) / 3 / 16
    assert sampling_variance([1.0, 0.0, 0.5, 0.25], 4) == pytest.approx(0.4375 / 3 / 16)
    assert sampling_variance([0.5, 0.5], 2) == pytest.approx(0.125)
    assert sampling_variance([0.5], 1) is None and sampling_variance([], 4) is None
    # a sweep of 3 seeds, k = 4 on 2 problems: off scores (0.5, 0.5), static (0.75, 0.25 + 0.25 s)
    st = Store(tmp_path, empty_db)
    parent = st.parent("choice_mpt_mode")
    for s in range(3):
        kw = {"sweep": "choice_mpt_mode", "parent": parent}
        off, static = {"p1": 0.5, "p2": 0.5}, {"p1": 0.75, "p2": 0.25 + 0.25 * s}
        st.run("fig4", {"algo.mpt.mode": "off", "eval.k": 4}, s, entropy=[0.2] * 10, heldout={150: 0.5},
               per_problem={150: off}, **kw)
        st.run("fig4", {"algo.mpt.mode": "static", "eval.k": 4}, s, entropy=[0.3] * 10,
               heldout={150: sum(static.values()) / 2}, per_problem={150: static}, **kw)
    r = _one(C.evaluate_claims(RunStore.open(st.uri)), "fig4_heldout")
    diffs = [0.0, 0.125, 0.25]                                    # static - off per seed
    assert [p["diff"] for p in r.per_seed] == pytest.approx(diffs)
    noise = [sampling_variance([0.5, 0.5], 4) + sampling_variance([0.75, 0.25 + 0.25 * s], 4) for s in range(3)]
    assert r.eval_k == 4
    assert r.eval_noise_share == pytest.approx(sum(noise) / 3 / 0.015625)   # var(diffs) = 0.125^2
    assert f"explains about {100 * r.eval_noise_share:.0f} %" in C.reading_markdown([r])


# ----------------------------------------------------------------------------- what the final evaluation costs


def test_final_evaluation_cost_is_read_from_the_paired_runs() -> None:
    # Table 3's committed runs, read straight from the records: per arm, over its paired seeds' runs that ran
    # in one sitting (no resumed_at_step tag), the range of time/final_eval_s and the mean of each run's own
    # shares: of time/wall_s, of the rest of the run, and of its periodic evals (mean time/eval_s x the timed
    # evals after step 0)
    path = ROOT / "experiments" / "results" / "choice_output_length.jsonl"
    source = ResultsStore.open(path)
    records = read_records(path)
    by_arm: dict[str, dict[str, dict]] = {}
    for rec in records:
        by_arm.setdefault(rec["params"]["rollout.max_response_len"], {})[rec["tags"]["ulorl.seed_offset"]] = rec
    paired = sorted(set(by_arm["192"]) & set(by_arm["96"]))
    r = _one(C.evaluate_claims(source), "table3_heldout")
    assert r.bench == C.FINAL and r.seeds == len(paired)
    block = C.final_cost_markdown([r])
    for arm, length in (("a", "192"), ("b", "96")):
        runs = [by_arm[length][s] for s in paired if "ulorl.resumed_at_step" not in by_arm[length][s]["tags"]]
        assert runs, "no run of this arm ran in one sitting"
        finals = [x["metrics"]["time/final_eval_s"] for x in runs]
        walls = [x["metrics"]["time/wall_s"] for x in runs]
        periodic = [x["means"]["time/eval_s"] * len([s for s in x["per_problem"]["heldout"]["steps"] if int(s) > 0])
                    for x in runs]
        share = sum(f / w for f, w in zip(finals, walls)) / len(runs)
        added = sum(f / (w - f) for f, w in zip(finals, walls)) / len(runs)
        vs = sum(f / p for f, p in zip(finals, periodic)) / len(runs)
        assert r.costs[arm]["runs"] == len(runs)
        assert r.costs[arm]["final_eval_s"] == pytest.approx(sum(finals) / len(runs))
        secs = f"{min(finals):.0f} s" if len(runs) == 1 else \
            f"{min(finals):.0f}-{max(finals):.0f} s over {len(runs)} runs"
        assert (f"{secs}, {100 * share:.1f} % of a run (+{100 * added:.1f} % on the run without it), "
                f"{vs:.1f} x its periodic evals together") in block
    k, problems = runs[0]["params"]["eval.final.k"], runs[0]["params"]["eval.final.num_problems"]
    assert f"k = {k} on {problems} problems" in block
    # rows that read the periodic evals have no final-evaluation cost
    assert C.final_cost_markdown([x for x in C.evaluate_claims(source) if x.bench != C.FINAL]).startswith("No ")


@pytest.mark.parametrize("spec_path", sorted(p for folder in C.SWEEP_FOLDERS
                                              for p in (ROOT / "sweeps" / folder).glob("*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_claim_row_names_the_sweep_file_that_produced_it(spec_path: Path) -> None:
    # the command column of a row from sweep "<folder>_<rest>" (its name:) is that sweep's own file, so
    # two rows of one claim from different sweeps say which is which
    name = yaml.safe_load(spec_path.read_text())["name"]
    assert name == f"{spec_path.parent.name}_{spec_path.stem}", f"{spec_path.relative_to(ROOT)}: name {name!r}"
    row = C.ClaimResult("fig4_entropy", "", C.M_ENTROPY, "a vs b", 1, f"{name} (0123abcd)")
    assert C._sweep_command(row, C.CLAIMS) == f"`ulorl-sweep {spec_path.relative_to(ROOT)}`"
