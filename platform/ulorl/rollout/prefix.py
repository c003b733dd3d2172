"""Prefix structure of a batch of token contexts: what the hf engine prefills, and how to rebuild it.

Torch-free (pure Python), shared by the engine and the rollout simulator so that both count
prefill tokens with the same code:

* ``prefix_forest`` / ``share_plan`` — the radix forest the hf engine prefills level by level
  (``ulorl.rollout.engines.hf``), pruned to the shares that pay;
* ``distinct_contexts`` / ``prefill_tokens`` — the engine's count ``HFEngineStats.prefill_tokens``
  of one batch (identical contexts merged, then one forward per planned node token);
* ``adjacent_lcps`` / ``sequences_with_lcps`` — a compact record of the prefix structure of a set of
  sequences (lexicographic order + longest common prefixes of neighbours) and synthetic sequences
  with exactly that structure. In lexicographic order the LCP of any two sequences is the minimum
  of the adjacent LCPs between them, so ``G - 1`` numbers describe all ``G (G - 1) / 2`` LCPs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["PrefixNode", "prefix_forest", "share_plan", "distinct_contexts", "prefill_tokens", "lcp",
           "adjacent_lcps", "sequences_with_lcps"]


@dataclass
class PrefixNode:
    """A node of the prefix forest: tokens ``[start, end)`` of context ``rep`` (shared by every
    context below it); ``ends``: contexts equal to the path ``[0, end)``; ``level``: depth in nodes."""

    start: int
    end: int
    rep: int
    parent: int
    level: int
    ends: list[int]


def prefix_forest(contexts: Sequence[Sequence[Hashable]]) -> list[PrefixNode]:
    """Compressed trie (radix forest) of non-empty token sequences.

    Every position shared by several contexts belongs to exactly one node, so prefilling each
    node once (after its parent) computes every context's keys/values with no repeated token.
    Example: ``[[1, 2, 3], [1, 2, 4], [5]]`` -> ``[1, 2]`` with children ``[3]`` and ``[4]``, and ``[5]``.
    """
    n = len(contexts)
    if any(len(c) == 0 for c in contexts):
        raise ValueError("prefix_forest: empty context")
    order = sorted(range(n), key=lambda i: list(contexts[i]))
    nodes: list[PrefixNode] = []
    stack = [(0, n, 0, -1, 0)] if n else []
    while stack:
        lo, hi, depth, parent, level = stack.pop()
        i = lo
        while i < hi:
            t = contexts[order[i]][depth]
            k = i + 1
            while k < hi and contexts[order[k]][depth] == t:
                k += 1
            first, last = contexts[order[i]], contexts[order[k - 1]]
            end, m = depth + 1, min(len(first), len(last))
            while end < m and first[end] == last[end]:
                end += 1
            r = i
            ends = []
            while r < k and len(contexts[order[r]]) == end:
                ends.append(order[r])
                r += 1
            nodes.append(PrefixNode(depth, end, order[k - 1], parent, level, ends))
            if r < k:
                stack.append((r, k, end, len(nodes) - 1, level + 1))
            i = k
    return nodes


def share_plan(nodes: list[PrefixNode], n_contexts: int, min_saving: int = 64) -> list[PrefixNode]:
    """Keep a shared node only where it pays: ``(users - 1) * tokens >= min_saving``.

    A dissolved node's tokens are prefilled again inside each of its children (each extra level
    costs a prefill pass and past copies, so sharing 3 tokens among 9 contexts is not worth it).
    Returns a new forest (parents before children, levels recomputed).
    """
    children: dict[int, list[int]] = {}
    for nid, nd in enumerate(nodes):
        children.setdefault(nd.parent, []).append(nid)
    users = [len(nd.ends) for nd in nodes]
    for nid in range(len(nodes) - 1, -1, -1):          # children come after their parent
        if nodes[nid].parent >= 0:
            users[nodes[nid].parent] += users[nid]
    out: list[PrefixNode] = []

    def visit(nid: int, start: int, parent: int) -> None:
        nd = nodes[nid]
        kids = children.get(nid, [])
        level = out[parent].level + 1 if parent >= 0 else 0
        if kids and (users[nid] - 1) * (nd.end - start) < min_saving:
            for u in nd.ends:
                out.append(PrefixNode(start, nd.end, u, parent, level, [u]))
            for c in kids:
                visit(c, start, parent)
            return
        out.append(PrefixNode(start, nd.end, nd.rep, parent, level, list(nd.ends)))
        me = len(out) - 1
        for c in kids:
            visit(c, nd.end, me)

    for root in children.get(-1, []):
        visit(root, 0, -1)
    assert sum(len(nd.ends) for nd in out) == n_contexts
    return out


def distinct_contexts(contexts: Sequence[Sequence[Hashable]]) -> tuple[list[Sequence[Hashable]], list[int]]:
    """Identical contexts merged, first occurrence first: ``(unique, index of each input in unique)``
    (the hf engine's step before the forest: the G new samples of a prompt are one context)."""
    uid_of: dict[tuple, int] = {}
    uniq: list[Sequence[Hashable]] = []
    idx: list[int] = []
    for c in contexts:
        key = tuple(c)
        u = uid_of.get(key)
        if u is None:
            u = uid_of[key] = len(uniq)
            uniq.append(c)
        idx.append(u)
    return uniq, idx


def prefill_tokens(contexts: Sequence[Sequence[Hashable]], min_saving: int = 64) -> int:
    """Tokens the hf engine's fast path forwards to prefill one batch of request contexts
    (``prompt_ids + prefix_ids``, every request with ``max_new_tokens > 0``): identical contexts
    merged, then the tokens of every node of ``share_plan(prefix_forest(...), min_saving)`` —
    exactly ``HFEngineStats.prefill_tokens`` of a one-batch ``generate`` call."""
    if not contexts:
        return 0
    uniq, _ = distinct_contexts(contexts)
    return sum(nd.end - nd.start for nd in share_plan(prefix_forest(uniq), len(uniq), min_saving))


def lcp(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    m = min(len(a), len(b))
    i = 0
    while i < m and a[i] == b[i]:
        i += 1
    return i


def adjacent_lcps(seqs: Sequence[Sequence[Hashable]]) -> tuple[list[int], list[int]]:
    """``(order, lcps)``: the indices of ``seqs`` in lexicographic order (stable) and the LCP of
    each neighbour pair in that order (``len(seqs) - 1`` values). ``LCP(order[i], order[j])`` for
    ``i < j`` is ``min(lcps[i:j])``."""
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    return order, [lcp(seqs[order[k]], seqs[order[k + 1]]) for k in range(len(order) - 1)]


def sequences_with_lcps(lengths: Sequence[int], lcps: Sequence[int], first_token: int = 0) -> list[list[int]]:
    """Synthetic sequences with the given lengths whose neighbour LCPs are ``lcps`` (in this order,
    which is also their lexicographic order): sequence k copies the first ``lcps[k-1]`` tokens of
    sequence k - 1 and continues with fresh tokens ``first_token, first_token + 1, ...`` (never
    used twice). Hence ``adjacent_lcps(sequences_with_lcps(L, C)) == (list(range(len(L))), list(C))``.
    Needs ``lcps[k] <= min(lengths[k], lengths[k + 1])`` and no sequence a proper prefix of its
    predecessor (both hold for a record made by ``adjacent_lcps``).
    """
    if len(lcps) != max(0, len(lengths) - 1):
        raise ValueError(f"need {max(0, len(lengths) - 1)} adjacent LCPs for {len(lengths)} sequences, "
                         f"got {len(lcps)}")
    out: list[list[int]] = []
    nxt = first_token
    for k, n in enumerate(lengths):
        if n < 0:
            raise ValueError(f"sequence length {n} < 0")
        keep = 0
        if k:
            keep = int(lcps[k - 1])
            if not 0 <= keep <= min(n, len(out[-1])):
                raise ValueError(f"LCP {keep} of sequences {k - 1} and {k} exceeds their lengths "
                                 f"({len(out[-1])}, {n}) or is negative")
            if keep == n < len(out[-1]):
                raise ValueError(f"sequence {k} would be a proper prefix of sequence {k - 1}: "
                                 "not lexicographic order")
        fresh = int(n) - keep
        out.append((out[-1][:keep] if k else []) + list(range(nxt, nxt + fresh)))
        nxt += fresh
    return out
