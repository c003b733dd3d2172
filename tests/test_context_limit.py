"""Engine context limit: the scheduler never asks an engine for more than its ``max_model_len``
(a clipped request finishes as truncated, counted), over-long prompts are dropped at load
(counted), and the dry-run plan prints the engine context and the rope scaling."""

from __future__ import annotations

from fakes import ScriptedEngine

from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler
from ulorl.rollout.types import SampleStatus, SamplingParams


def _sched(engine, **kw) -> SegmentScheduler:
    args = dict(segments=2, max_response_len=16, group_size=1, prompts_per_step=1, sampling=SamplingParams())
    args.update(kw)
    return SegmentScheduler(engine, **args)


def test_requests_never_exceed_the_engine_limit_and_clipped_rows_finish_truncated():
    eng = ScriptedEngine(lengths={0: 99, 1: 99})
    eng.max_model_len = 3 + 12            # prompt of 3 tokens: room for 12 of the 16 response tokens
    sched = _sched(eng)
    r1 = sched.step([PromptRequest(prompt_ids=[100, 7, 8], answer="1")], 0)
    assert r1.clipped == 0 and r1.continued == 1
    r2 = sched.step([], 0)
    assert [c[0].max_new_tokens for c in eng.calls] == [8, 4]        # second segment clipped from 8 to 4
    for call in eng.calls:
        for q in call:
            assert len(q.prompt_ids) + len(q.prefix_ids) + q.max_new_tokens <= eng.max_model_len
    assert r2.clipped == 1 and r2.truncated == 1 and r2.metrics()["rollout/context_clipped"] == 1
    s = r2.completed[0]
    assert s.status is SampleStatus.TRUNCATED and s.response_len == 12 and s.reward == 0.0


def test_a_prompt_at_the_limit_gets_no_request_and_is_truncated():
    eng = ScriptedEngine(lengths={0: 99})
    eng.max_model_len = 3
    r = _sched(eng).step([PromptRequest(prompt_ids=[100, 7, 8], answer="1")], 0)
    assert eng.calls == [] and r.clipped == 1 and r.truncated == 1


def test_eos_inside_a_clipped_budget_still_finishes():
    eng = ScriptedEngine(lengths={0: 3})
    eng.max_model_len = 3 + 5
    r = _sched(eng, segments=1).step([PromptRequest(prompt_ids=[100, 7, 8], answer="1")], 0)
    assert r.clipped == 1 and r.finished == 1 and r.truncated == 0


def test_engines_without_a_limit_are_unchanged():
    eng = ScriptedEngine(lengths={0: 99})
    r = _sched(eng).step([PromptRequest(prompt_ids=[100, 7, 8], answer="1")], 0)
    assert r.clipped == 0 and eng.calls[0][0].max_new_tokens == 8


def test_over_long_prompts_dropped_at_load_and_counted():
    from ulorl.data.types import PromptItem
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.train.prompts import PromptStream, encode_prompt

    tok = build_tokenizer()
    items = [PromptItem(id=str(i), problem="1+" * (3 if i % 2 else 60) + "1", answer="x") for i in range(6)]
    lens = [len(encode_prompt(it, tok).prompt_ids) for it in items]
    budget = (min(lens) + max(lens)) // 2
    stream = PromptStream(items, tok, seed=0, max_prompt_len=budget)
    assert stream.dropped_too_long == 3 and len(stream.items) == 3
    assert all(len(p.prompt_ids) <= budget for p in stream.take(9))
    assert PromptStream(items, tok, seed=0).dropped_too_long == 0


def test_engine_sizing_from_config():
    from ulorl.config import load_experiment
    from ulorl.rollout.engine_config import engine_context, engine_rollout_config, prompt_budget, tensor_parallel_size
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = load_experiment(root / "experiments" / "quickstart.yaml", ["rollout.max_response_len=96"])
    assert engine_context(cfg.rollout) == 512 + 96 and prompt_budget(cfg.rollout) == 512
    assert tensor_parallel_size(cfg) == 1
    cfg2 = load_experiment(root / "experiments" / "quickstart.yaml",
                           ["resources.gpus_per_engine=2", "rollout.engine_max_model_len=4096"])
    r = engine_rollout_config(cfg2)
    assert r.tensor_parallel_size == 2 and r.engine_max_model_len == 4096
    cfg3 = load_experiment(root / "experiments" / "quickstart.yaml", ["rollout.tensor_parallel_size=4"])
    assert tensor_parallel_size(cfg3) == 4


def test_paper_128k_profiles_carry_yarn_covering_the_engine_context(capsys):
    import json
    from pathlib import Path

    from ulorl.cli.train import main

    root = Path(__file__).resolve().parents[1]
    for name in ("qwen3_4b_128k", "qwen3_8b_128k", "qwen3_30b_a3b_128k"):
        assert main([str(root / "experiments" / "paper" / f"{name}.yaml"), "--dry-run"]) == 0
        out = capsys.readouterr().out
        eng = json.loads(out.split("# plan\n", 1)[1])["engine"]
        assert eng["max_model_len"] == 135168 >= 131072 + eng["prompt_budget"]
        assert eng["rope_scaling"] == {"rope_type": "yarn", "factor": 4.125, "original_max_position_embeddings": 32768}
        assert eng["max_position_embeddings"] == 135168 and eng["positions_cover_context"] is True
        assert eng["tensor_parallel_size"] == 1
