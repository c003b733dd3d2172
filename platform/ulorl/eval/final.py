"""The final evaluation's problems: held-out problems no periodic evaluation scores.

A sweep selects on its periodic evals (the first ``eval.num_problems`` held-out problems, k small
so they stay cheap). Its verdicts read one evaluation after the last step (``eval.final``: its own
k, e.g. 16, on e.g. 512 problems) on the problems after those, so the search never saw them and
evaluation noise (1 / (problems x k) per problem-sample) shrinks. A held-out stream can repeat a
problem (the embedded ``choice`` task: 22 of held-out items 256-767 repeat one of items 0-255), so
a problem whose prompt a periodic eval scores, or that the final set already holds, is skipped:

    items = load_items(...)                                   # the held-out split, in order
    fresh = final_items(items, periodic=64, n=512)            # Sequence[PromptItem], 512 long

The embedded tasks' held-out split is a prefix of one endless stream (``ulorl.data.task.first_items``)
and the train split another stream, so raising ``data.task.num_heldout`` to hold these problems
changes neither the periodic eval's problems nor the training prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

from ulorl.data.types import PromptItem

FINAL_SUFFIX = "_final"   # eval/<bench>_final/*: the benchmark name of the final evaluation


def problem_key(item: PromptItem) -> str:
    """What makes two held-out items the same problem: the text fed to the model (the embedded
    tasks' own prompt, else the raw problem a template is applied to)."""
    return item.prompt or item.problem


def final_items(items: Sequence[PromptItem], periodic: int, n: int) -> list[PromptItem]:
    """The first ``n`` items of ``items[periodic:]`` whose problem is neither among ``items[:periodic]``
    (what the periodic evals score) nor an earlier pick; ValueError naming the fix when fewer exist."""
    if periodic < 0 or n < 1:
        raise ValueError(f"need periodic >= 0 and n >= 1, got periodic={periodic}, n={n}")
    seen = {problem_key(it) for it in items[:periodic]}
    out: list[PromptItem] = []
    for it in items[periodic:]:
        key = problem_key(it)
        if key in seen:
            continue
        seen.add(key)
        out.append(it)
        if len(out) == n:
            return out
    raise ValueError(
        f"eval.final.num_problems ({n}): only {len(out)} held-out problems after the first {periodic} (the periodic "
        f"eval's) are new among {len(items)}; raise data.task.num_heldout (embedded tasks) or lower "
        "eval.final.num_problems")


def final_bench(bench: str) -> str:
    """``heldout -> heldout_final``: the benchmark name the final evaluation logs under."""
    return bench + FINAL_SUFFIX


__all__ = ["FINAL_SUFFIX", "final_bench", "final_items", "problem_key"]
