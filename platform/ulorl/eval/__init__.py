"""Benchmark evaluation: avg@k / pass@k with the paper's eval sampling (``ulorl-eval``)."""

from ulorl.eval.runner import EVAL_SAMPLING, EvalResult, evaluate, log_eval_result, pass_ks, summarize

__all__ = ["EVAL_SAMPLING", "EvalResult", "evaluate", "log_eval_result", "pass_ks", "summarize"]
