"""Rewards: ``\\boxed{}`` extraction, math-verify rule check (thread-safe, time-bounded in a
process pool) and the optional generative judge. Importing this package does not import sympy."""

from ulorl.reward.extract import EXTRACTION_MODES, extract_answer, extract_last_boxed
from ulorl.reward.judge import GenerativeJudge, judge_from_config, parse_verdict
from ulorl.reward.scorer import RewardScorer, ScorerError
from ulorl.reward.verify import canonical_integer, compute_reward, verify_answer

__all__ = [
    "EXTRACTION_MODES",
    "GenerativeJudge",
    "RewardScorer",
    "ScorerError",
    "canonical_integer",
    "compute_reward",
    "extract_answer",
    "extract_last_boxed",
    "judge_from_config",
    "parse_verdict",
    "verify_answer",
]
