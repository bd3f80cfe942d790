"""Suffix speculation (SuffixDecoding, Oliaro et al. 2025): drafts from what followed the
longest matching suffix of the text, in this request and in earlier ones; no training.

Two indexes, both suffix automata (SAM) over token ids with occurrence counts:
- local: the current request's prompt + committed tokens, rebuilt by `reset`;
- global: earlier requests of this drafter (or of every drafter handed the same
  `SuffixCache`), each followed by a unique negative separator so that no match crosses a
  request boundary. Bounded by `global_max_tokens`: the least recently used requests (a
  request is used when it is inserted and when a draft taken from it is accepted) are
  evicted and the automaton is rebuilt from the rest.

Why a suffix automaton: it has at most 2T states for T tokens (a bounded-depth trie holds
up to T * depth nodes), appends a token in amortised O(1), and gives the longest suffix of
the text seen before for free (the suffix link of the last state; matching statistics
against the global index). A state is a class of substrings with the same end positions,
so occ(state) is the frequency of every string in it, and the transition on token c from the
matched state leads to the class of (suffix + c): P(c | suffix) = occ(child) / occ(state),
less the one occurrence that ends at the end of the text (it has no continuation yet).

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

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from draftkit.verify.contract import Budget, DecodeState, DraftTree, StepResult

# link-path steps per appended token when updating occurrence counts: the path is as long as
# the number of distinct occurrence sets among the repeated suffixes (short for real text; as
# long as the run in "a a a a ..."). Past the cap, shorter strings are under-counted (drafts
# only get a little worse; decoding stays exact).
WALK_CAP = 512
MATCH_TRIES = 4  # match lengths tried per index: the longest and its suffix-link ancestors
RANK_FANOUT = 16  # states with more children than this walk them in count order (cached)
REMATCH_TAIL = 512  # tokens re-matched against a global index that changed under a request


class SuffixIndex:
    """A suffix automaton over one token stream. States are ints (0 = root, the empty string);
    per state: length (longest string), link (suffix link), next (token -> state), occ (number
    of end positions), term (stream length when it was last on the terminal path), owner
    (the tag of the latest sequence that passed through it)."""

    def __init__(self):
        self.length, self.link, self.next = [0], [-1], [{}]
        self.occ, self.term, self.owner = [0], [0], [-1]
        self.last = 0  # state of the whole stream
        self.n = 0  # tokens appended (separators included)
        self._rank: dict[int, list] = {}  # state -> its children by count (see _ranked)
        self._rank_n = 0

    def __len__(self) -> int:
        return self.n

    def _new(self, length: int, link: int, nxt: dict, occ: int, owner: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(nxt)
        self.occ.append(occ)
        self.term.append(0)
        self.owner.append(owner)
        return len(self.length) - 1

    def append(self, t: int, tag: int = -1) -> None:
        """Extend the stream by token t (the classic online construction), then count the new
        end position in every state on the suffix-link path of the new last state."""
        length, link, nxt = self.length, self.link, self.next
        cur = self._new(length[self.last] + 1, 0, {}, 0, tag)
        p = self.last
        while p != -1 and t not in nxt[p]:
            nxt[p][t] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][t]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: the clone keeps q's end positions and gains the new one below
                clone = self._new(length[p] + 1, link[q], dict(nxt[q]), self.occ[q], self.owner[q])
                while p != -1 and nxt[p].get(t) == q:
                    nxt[p][t] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        self.n += 1
        occ, term, owner, n = self.occ, self.term, self.owner, self.n
        s, k = cur, 0
        while s > 0 and k < WALK_CAP:
            occ[s] += 1
            term[s] = n
            owner[s] = tag
            s = link[s]
            k += 1

    def extend(self, tokens, tag: int = -1) -> None:
        for t in tokens:
            self.append(t, tag)

    # --- matching ----------------------------------------------------------------------------
    def longest_repeat(self) -> tuple[int, int]:
        """(state, length) of the longest suffix of the stream that also ends earlier."""
        s = self.link[self.last] if self.last > 0 else 0
        return s, self.length[s]

    def step(self, state: int, matched: int, t: int) -> tuple[int, int]:
        """Matching statistics: given (state, matched) for a text, those of text + [t]: the
        longest suffix of text + [t] that occurs in the stream."""
        nxt, link = self.next, self.link
        while state and t not in nxt[state]:
            state = link[state]
            matched = self.length[state]
        if t in nxt[state]:
            return nxt[state][t], matched + 1
        return 0, 0

    def find(self, pattern) -> tuple[int, int]:
        """(state, length) of the longest suffix of `pattern` that occurs in the stream."""
        state, matched = 0, 0
        for t in pattern:
            state, matched = self.step(state, matched, t)
        return state, matched

    def count(self, pattern) -> int:
        """How often `pattern` (a non-empty token list) occurs in the stream."""
        state = 0
        for t in pattern:
            state = self.next[state].get(t)
            if state is None:
                return 0
        return self.occ[state]

    def continuations(self, state: int) -> dict[int, float]:
        """P(next token | the strings of `state`): token -> empirical frequency. The occurrence
        at the very end of the stream (nothing follows it yet) is left out; separators count
        as 'the sequence ended' and are not returned."""
        total = self.occ[state] - (self.term[state] == self.n)
        if total <= 0:
            return {}
        return {c: self.occ[u] / total for c, u in self.next[state].items() if c >= 0}

    # --- speculation -------------------------------------------------------------------------
    def speculate(self, state: int, max_nodes: int, max_depth: int, min_prob: float):
        """Best-first tree under `state`: each popped frontier item is the most probable path
        not yet in the tree. Returns (tokens, parents, probs), topological, siblings in
        descending probability."""
        tokens, parents, probs = [], [], []
        occ, term, nxt, n = self.occ, self.term, self.next, self.n
        heap = [(-1.0, 0, state, -1, -1, 0)]  # (-prob, tiebreak, sam state, token, parent, depth)
        tie = 1
        while heap and len(tokens) < max_nodes:
            negp, _, s, tok, par, d = heapq.heappop(heap)
            prob = -negp
            me = par
            if tok >= 0:  # the start item is the match itself, not a node
                me = len(tokens)
                tokens.append(tok)
                parents.append(par)
                probs.append(prob)
            if d >= max_depth:
                continue
            total = occ[s] - (term[s] == n)
            if total <= 0:
                continue
            floor = min_prob * total / prob  # children below this count are pruned
            kids = nxt[s]
            if len(kids) > RANK_FANOUT:  # a frequent context: walk its children by count, stop early
                for cu, c, u in self._ranked(s):
                    if cu < floor:
                        break
                    heapq.heappush(heap, (-min(prob, prob * cu / total), tie, u, c, me, d + 1))
                    tie += 1
                continue
            for c, u in kids.items():
                cu = occ[u]
                if c >= 0 and cu >= floor:
                    heapq.heappush(heap, (-min(prob, prob * cu / total), tie, u, c, me, d + 1))
                    tie += 1
        return tokens, parents, probs

    def _ranked(self, state: int) -> list[tuple[int, int, int]]:
        """[(count, token, child)] of `state`, most frequent first, separators left out; cached
        until the stream grows (the global index only grows between requests)."""
        if self._rank_n != self.n:
            self._rank, self._rank_n = {}, self.n
        ranked = self._rank.get(state)
        if ranked is None:
            occ = self.occ
            ranked = sorted(((occ[u], c, u) for c, u in self.next[state].items() if c >= 0),
                            key=lambda x: -x[0])
            self._rank[state] = ranked
        return ranked


class SuffixCache:
    """The global index: earlier requests' token sequences, LRU, at most `max_tokens` tokens.
    Share one object between drafters to share what they have seen."""

    def __init__(self, max_tokens: int = 65536):
        if max_tokens < 1:
            raise ValueError(f"global_max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.seqs: OrderedDict[int, list[int]] = OrderedDict()  # tag -> tokens, least recent first
        self.total = 0
        self.next_tag = 0
        self.index = SuffixIndex()
        self.version = 0  # bumped whenever the index changes (drafters redo their matching)

    def add(self, tokens: list[int]) -> int:
        """Insert one finished request; evict least recently used ones past the bound."""
        tokens = list(tokens[-self.max_tokens:])
        tag = self.next_tag
        self.next_tag += 1
        if not tokens:
            return tag
        self.seqs[tag] = tokens
        self.total += len(tokens)
        if self.total > self.max_tokens:
            # evict down to 3/4 of the bound, so that rebuilds (O(tokens kept)) stay rare
            while self.total > self.max_tokens * 3 // 4 and len(self.seqs) > 1:
                _, old = self.seqs.popitem(last=False)
                self.total -= len(old)
            self._rebuild()
        else:
            self._insert(tag, tokens)
        self.version += 1
        return tag

    def touch(self, tag: int) -> None:
        """A draft taken from request `tag` was accepted: make it the most recently used."""
        if tag in self.seqs:
            self.seqs.move_to_end(tag)

    def _insert(self, tag: int, tokens: list[int]) -> None:
        self.index.extend(tokens, tag)
        self.index.append(-1 - tag, tag)  # a unique separator: nothing matches across requests

    def _rebuild(self) -> None:
        self.index = SuffixIndex()
        for tag, tokens in self.seqs.items():
            self._insert(tag, tokens)

    def clear(self) -> None:
        self.seqs.clear()
        self.total = 0
        self.index = SuffixIndex()
        self.version += 1


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
