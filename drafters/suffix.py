"""Suffix speculation (SuffixDecoding, Oliaro et al. 2025): drafts from what followed the
longest matching suffix of the text, in this request and in earlier ones; no training.

Two indexes, both suffix automata (SAM) over token ids with occurrence counts:
- local: the current request's prompt + committed tokens, rebuilt by `reset`;
- global: earlier requests of this drafter (or of every drafter handed the same
  `SuffixCache`), each followed by a unique negative separator so that no match crosses a
  request boundary. Bounded by `global_max_tokens`: the least recently used requests (a
  request is used when it is inserted and when a draft taken from it is accepted) are
  evicted and the automaton is rebuilt from the rest.

The automata and why: drafters/suffix_index.py.

Each step, in each index: for the longest match and up to three shorter ones (its
suffix-link ancestors), grow a tree best-first by path probability (the product of the
empirical continuation frequencies from the match down; paths below `min_prob` pruned) with
at most alpha * match_length + offset nodes (SuffixDecoding's adaptive length), within the
step's budget, and keep the one with the highest score (sum of node probabilities: the
expected accepted tokens if the frequencies were the truth). The draft is the union of the
local and the global winners (shared prefixes once, the higher score's nodes first), cut
to the node budget. Proposals are deterministic (q = None), so sampling stays lossless.

Cost (eval/bench_suffix.py measures it): about 0.5 KB and a few microseconds per indexed
token; tens of microseconds per propose + update at a 512-token context. Evicting rebuilds
the global automaton from the requests kept (O(tokens kept), once per quarter of the bound).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftkit.drafters.suffix_index import SuffixCache, SuffixIndex  # noqa: F401 - SuffixIndex: part of this module's API
from draftkit.verify.contract import Budget, DecodeState, DraftTree, StepResult

MATCH_TRIES = 4  # match lengths tried per index: the longest and its suffix-link ancestors
REMATCH_TAIL = 512  # tokens re-matched against a global index that changed under a request


def merge(toks: list[int], pars: list[int], toks2: list[int], pars2: list[int], cap: int):
    """The union of two draft trees (host lists, topological) as one tree of at most `cap`
    nodes: the first whole, then the second's nodes that are new (shared prefixes once), in
    its order. Returns (tokens, parents, where) with where[i] = node i of the second tree in
    the union, or None when it did not fit."""
    toks, pars = list(toks), list(pars)
    at = {(p, t): i for i, (t, p) in enumerate(zip(toks, pars))}  # (parent, token) -> node
    where: list[int | None] = []
    for t, p in zip(toks2, pars2):
        par = where[p] if p >= 0 else -1
        node = None
        if par is not None:
            node = at.get((par, t))
            if node is None and len(toks) < cap:
                node = at[(par, t)] = len(toks)
                toks.append(t)
                pars.append(par)
        where.append(node)
    return toks, pars, where


@dataclass
class SuffixDraft:
    """DraftTree.extra of a suffix draft. score: sum of node probabilities (the expected
    accepted tokens if the empirical frequencies were the truth); tag: the earlier request
    the global tree came from; from_global: the nodes that the global index proposed."""

    score: float
    tag: int | None
    from_global: set = field(default_factory=set)


def _knob(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass
class SuffixConfig:
    """The suffix drafter's settings (each one a constructor keyword of SuffixDrafter)."""

    max_depth: int = _knob(16, "most draft levels per step")
    max_nodes: int = _knob(16, "most draft nodes per step (the tree size)")
    min_prob: float = _knob(0.1, "prune draft nodes whose path probability (product of continuation "
                                 "frequencies) is below this")
    alpha: float = _knob(1.0, "adaptive length: a match of m tokens drafts at most alpha * m + offset nodes "
                              "(SuffixDecoding: alpha 1)")
    offset: float = _knob(4.0, "adaptive length: a match of m tokens drafts at most alpha * m + offset nodes "
                               "(SuffixDecoding: 0; 4 pays on CPUs, where the first node costs most)")
    use_global: bool = _knob(True, "also match earlier requests of this drafter (the global cache)")
    global_max_tokens: int = _knob(65536, "memory bound of the global cache in tokens (about 0.5 KB "
                                          "each); least recently used requests are evicted")
    global_prompts: bool = _knob(True, "put earlier requests' prompts in the global cache, not only "
                                       "their outputs")


class SuffixDrafter:
    """SuffixDecoding-style drafter. Flags (see SuffixConfig):

    max_depth, max_nodes: the largest tree it drafts (its `budget_cap`); a step's budget may
        give less.
    min_prob: nodes whose path probability (product of empirical continuation frequencies
        from the match down to the node) is below it are not drafted; in [0, 1].
    alpha, offset: a match of length m drafts at most floor(alpha * m + offset) nodes (longer
        matches are more trustworthy). alpha >= 0; offset any finite number.
    use_global: keep earlier requests in a global index and draft from it too.
    global_max_tokens: the global index's bound in tokens; least recently used requests go
        first (a request is used when inserted and when a draft from it is accepted).
    global_prompts: insert earlier requests' prompts too, not only what was generated.
    global_cache: a SuffixCache to share between drafters (default: a private one).
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, max_depth: int = 16, max_nodes: int = 16, min_prob: float = 0.1, alpha: float = 1.0,
                 offset: float = 4.0, use_global: bool = True, global_max_tokens: int = 65536,
                 global_prompts: bool = True, global_cache: SuffixCache | None = None):
        if max_depth < 1 or max_nodes < 1:
            raise ValueError(f"max_depth and max_nodes must be >= 1, got {max_depth} and {max_nodes}")
        if not 0.0 <= min_prob <= 1.0:  # also rejects nan
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
        if not math.isfinite(offset):
            raise ValueError(f"offset must be a finite number, got {offset}")
        if global_max_tokens < 1:
            raise ValueError(f"global_max_tokens must be >= 1, got {global_max_tokens}")
        self.budget_cap = Budget(max_depth, max_nodes)
        self.min_prob, self.alpha, self.offset = float(min_prob), float(alpha), float(offset)
        self.use_global, self.global_prompts = bool(use_global), bool(global_prompts)
        self.cache = (global_cache or SuffixCache(global_max_tokens)) if use_global else None
        self.local = SuffixIndex()
        self.tokens: list[int] = []
        self.prompt_len = 0
        self.g_state = self.g_len = 0  # matching statistics of self.tokens against the global index
        self.g_version = -1

    # --- state -----------------------------------------------------------------------------
    def reset(self, prompt) -> None:
        """A new request: the previous one goes to the global index, the prompt is indexed."""
        self.end_request()
        self._start(prompt.tolist())

    def end_request(self) -> None:
        """Hand the current request to the global index now (reset does it otherwise; the
        decoding loop does not call update after the last step, so its tokens are not seen)."""
        if self.cache is not None and len(self.tokens) > self.prompt_len:
            self.cache.add(self.tokens if self.global_prompts else self.tokens[self.prompt_len:])
        self._start([])

    def forget(self) -> None:
        """Drop the global index's requests and the current one (a benchmark's new repeat)."""
        if self.cache is not None:
            self.cache.clear()
        self._start([])

    def _start(self, tokens: list[int]) -> None:
        self.tokens, self.prompt_len = [], len(tokens)
        self.local = SuffixIndex()
        self.g_state = self.g_len = 0
        self.g_version = self.cache.version if self.cache is not None else -1
        self._extend(tokens)

    def _extend(self, new: list[int]) -> None:
        self.tokens.extend(new)
        self.local.extend(new)
        if self.cache is None:
            return
        if self.g_version != self.cache.version:  # a drafter sharing the cache added to it
            self.g_version = self.cache.version
            self.g_state, self.g_len = self.cache.index.find(self.tokens[-REMATCH_TAIL:])
        elif len(self.cache.index):
            g, s, m = self.cache.index, self.g_state, self.g_len
            for t in new:
                s, m = g.step(s, m, t)
            self.g_state, self.g_len = s, m

    # --- proposing ---------------------------------------------------------------------------
    def outlook(self) -> int:
        """How far this step's draft should pass, told by the longest match alone (contract.Drafter.outlook): 1 for
        a match of 0-1 tokens, 2 for 2-3, 3 for 4-7, 4 for 8 or more (quoting). SuffixDecoding sizes its tree by
        the match for the same reason; here the controller prices each outlook's steps by what they passed, so a
        quote is drafted deep from its first steps while chat's short matches draft little."""
        matched = self.local.longest_repeat()[1]
        if self.cache is not None:
            matched = max(matched, self.g_len)
        return 1 + (matched >= 2) + (matched >= 4) + (matched >= 8)

    def _candidates(self, index: SuffixIndex, state: int, matched: int, budget_nodes: int, depth: int,
                    floor: float):
        """Trees for the match and up to MATCH_TRIES - 1 shorter ones; the best (score, ...)."""
        best = (0.0, [], [], None)
        for _ in range(MATCH_TRIES):
            if state <= 0 or matched <= 0:
                break
            cap = min(budget_nodes, int(self.alpha * matched + self.offset + 1e-6))
            if cap <= best[0]:  # a shorter match drafts fewer nodes: no better score possible
                break
            toks, pars, probs = index.speculate(state, cap, depth, floor)
            score = sum(probs)
            if score > best[0]:
                best = (score, toks, pars, state)
            state = index.link[state]
            matched = index.length[state]
        return best

    def propose(self, state: DecodeState) -> DraftTree:
        if state.tokens.numel() != len(self.tokens):  # a caller skipped update(): resynchronise
            self._start(state.tokens.tolist())
        depth = min(state.budget.max_depth, self.budget_cap.max_depth)
        nodes = min(state.budget.max_nodes, self.budget_cap.max_nodes)
        dev = state.tokens.device
        if depth < 1 or nodes < 1:
            return DraftTree.empty(dev)
        # a budget policy may ask to stop paths whose probability does not pay for their depth
        floor = max(self.min_prob, getattr(state.budget, "min_path_prob", 0.0))
        s, m = self.local.longest_repeat()
        score, toks, pars, _ = self._candidates(self.local, s, m, nodes, depth, floor)
        if self.cache is None:
            return DraftTree.from_lists(toks, pars, dev, extra=SuffixDraft(score, None))
        if self.g_version != self.cache.version:
            self._extend([])
        g = self.cache.index
        gscore, gtoks, gpars, gs = self._candidates(g, self.g_state, self.g_len, nodes, depth, floor)
        tag = g.owner[gs] if gtoks else None
        if gscore > score:  # the better tree first: its nodes lead among siblings
            toks, pars, _ = merge(gtoks, gpars, toks, pars, nodes)
            from_global = set(range(len(gtoks)))
        else:
            toks, pars, where = merge(toks, pars, gtoks, gpars, nodes)
            from_global = {i for i in where if i is not None}
        return DraftTree.from_lists(toks, pars, dev, extra=SuffixDraft(max(score, gscore), tag, from_global))

    # --- learning ----------------------------------------------------------------------------
    def update(self, result: StepResult) -> None:
        self._extend(result.new_token_list)
        d = result.tree.extra
        if isinstance(d, SuffixDraft) and d.tag is not None and not d.from_global.isdisjoint(result.accepted):
            self.cache.touch(d.tag)  # a draft from that earlier request was accepted: keep it longer
