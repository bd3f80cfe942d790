"""Lookahead decoding (Fu et al. 2024) and prompt lookup: n-gram drafts, no training.

Two sources of candidate continuations for the root token, merged into one trie:
- lookup: the most recent places in the committed text (prompt + generated) where
  the last two (or one) tokens occurred before; propose what followed them;
- the n-gram pool, filled by the lookahead branch.

The lookahead branch rides along in the same verification forward as extra tree
nodes. It holds N - 1 levels of W guesses; column i of every level sits at
depth i + 1. Level 0 is a chain off the root; node (j, i) for j >= 1 hangs under
(j - 1, i - 1) (or the root when i = 0), so each node sees level 0 up to its
diagonal and its own diagonal: exactly the 2D window mask of the paper, which
is a tree. The target's argmax at (N - 2, i) is one Jacobi update: it becomes
column i + 1 of the next level, and the diagonal plus that prediction is an
n-gram for the pool. These nodes are ordinary deterministic drafts, so the
target may also accept them; acceptance stays lossless.
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict

import torch

from draftkit.verify.contract import Budget, DecodeState, DraftTree, StepResult


class LookaheadDrafter:
    """ngram: N (n-gram length, levels = N - 1); window: W (0 disables the lookahead branch:
    pure prompt lookup); guesses: G candidates verified per step; max_depth: tokens proposed per
    candidate; max_nodes: cap on the tree size, lookahead branch included (the branch rides along
    only when the candidates leave room for its W * (N - 1) nodes)."""

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, ngram: int = 3, window: int = 4, guesses: int = 4, max_depth: int = 6,
                 max_nodes: int = 48, pool_size: int = 8, seed: int = 0):
        if ngram < 2:
            raise ValueError(f"ngram (N) must be >= 2, got {ngram}")
        if window < 0 or guesses < 1 or max_depth < 1 or max_nodes < 1:
            raise ValueError("window must be >= 0 and guesses, max_depth, max_nodes >= 1")
        self.n, self.w, self.g = ngram, window, guesses
        self.budget_cap = Budget(max_depth, max_nodes)
        self.pool_size = pool_size
        self.seed = seed

    # --- state -----------------------------------------------------------------------------
    def reset(self, prompt: torch.Tensor) -> None:
        self.tokens: list[int] = []
        self.where1: dict[int, list[int]] = defaultdict(list)  # token -> positions it ends at
        self.where2: dict[tuple[int, int], list[int]] = defaultdict(list)  # bigram -> end positions
        self.pool: dict[int, OrderedDict] = defaultdict(OrderedDict)  # first token -> continuations
        self._extend(prompt.tolist())
        gen = torch.Generator().manual_seed(self.seed)
        # the paper starts the window from random prompt tokens
        pick = torch.randint(0, len(self.tokens), ((self.n - 1) * self.w,), generator=gen).tolist()
        flat = [self.tokens[i] for i in pick]
        self.levels = [flat[j * self.w:(j + 1) * self.w] for j in range(self.n - 1)] if self.w else []

    def _extend(self, new: list[int]) -> None:
        for t in new:
            pos = len(self.tokens)
            self.tokens.append(t)
            self.where1[t].append(pos)
            if pos >= 1:
                self.where2[(self.tokens[pos - 1], t)].append(pos)

    def _add_ngram(self, key: int, cont: tuple[int, ...]) -> None:
        bucket = self.pool[key]
        bucket.pop(cont, None)
        bucket[cont] = None  # most recent last
        if len(bucket) > self.pool_size:
            bucket.popitem(last=False)

    # --- proposing ---------------------------------------------------------------------------
    def _candidates(self, depth: int) -> list[tuple[int, ...]]:
        """Up to G continuations of the root, best first: bigram matches, unigram matches, pool."""
        found: list[tuple[int, ...]] = []
        end = len(self.tokens) - 1
        keys = []
        if end >= 1:
            keys.append(self.where2.get((self.tokens[end - 1], self.tokens[end]), []))
        keys.append(self.where1.get(self.tokens[end], []))
        for positions in keys:
            for p in reversed(positions):
                if p == end:
                    continue
                cont = tuple(self.tokens[p + 1:p + 1 + depth])
                if cont and cont not in found:
                    found.append(cont)
                if len(found) >= self.g:
                    return found
        for cont in reversed(self.pool.get(self.tokens[end], {})):
            cont = cont[:depth]
            if cont not in found:
                found.append(cont)
            if len(found) >= self.g:
                break
        return found

    def propose(self, state: DecodeState) -> DraftTree:
        if state.tokens.numel() != len(self.tokens):  # only if a caller skipped update()
            self.reset(state.tokens)
        depth, max_nodes = state.budget.max_depth, state.budget.max_nodes
        branch = self.w * (self.n - 1)
        room = max_nodes - branch if self.w and max_nodes >= 2 * branch else max_nodes  # keep the branch
        tokens: list[int] = []
        parents: list[int] = []
        if depth >= 1:
            trie: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
            for cont in self._candidates(depth):
                par = -1
                for t in cont:
                    if (par, t) not in trie:
                        if len(tokens) >= room:
                            break
                        trie[(par, t)] = len(tokens)
                        tokens.append(t)
                        parents.append(par)
                    par = trie[(par, t)]
        lookahead_start = len(tokens)
        slots = None
        if self.w and len(tokens) + branch <= max_nodes and depth >= self.w:
            slots = {}  # (level, column) -> node index
            for j, level in enumerate(self.levels):
                for i, t in enumerate(level):
                    par = -1 if i == 0 else slots[(0 if j == 0 else j - 1, i - 1)]
                    slots[(j, i)] = len(tokens)
                    tokens.append(t)
                    parents.append(par)
        return DraftTree.from_lists(tokens, parents, state.tokens.device, extra=(lookahead_start, slots))

    # --- learning ----------------------------------------------------------------------------
    def update(self, result: StepResult) -> None:
        self._extend(result.new_token_list)
        if not len(result.tree):
            return
        _, slots = result.tree.extra
        if not slots:
            return
        pred = result.top1 if result.top1 is not None else result.logits.argmax(-1).tolist()  # row s + 1 = node s
        top = self.n - 2
        for i in range(self.n - 2, self.w):  # diagonals that span every level
            diag = [self.levels[j][i - top + j] for j in range(self.n - 1)]
            self._add_ngram(diag[0], tuple(diag[1:]) + (pred[slots[(top, i)] + 1],))
        new_level = [pred[0]] + [pred[slots[(top, i)] + 1] for i in range(self.w - 1)]
        self.levels = self.levels[1:] + [new_level]
