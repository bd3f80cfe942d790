"""The suffix automata drafters/suffix.py matches against: SuffixIndex (one token stream) and SuffixCache
(earlier requests, bounded, least recently used evicted).

Why a suffix automaton: it has at most 2T states for T tokens (a bounded-depth trie holds
up to T * depth nodes), appends a token in amortised O(1), and gives the longest suffix of
the text seen before for free (the suffix link of the last state; matching statistics
against the global index). A state is a class of substrings with the same end positions,
so occ(state) is the frequency of every string in it, and the transition on token c from the
matched state leads to the class of (suffix + c): P(c | suffix) = occ(child) / occ(state),
less the one occurrence that ends at the end of the text (it has no continuation yet).
"""
from __future__ import annotations

import heapq
from collections import OrderedDict


# link-path steps per appended token when updating occurrence counts: the path is as long as
# the number of distinct occurrence sets among the repeated suffixes (short for real text; as
# long as the run in "a a a a ..."). Past the cap, shorter strings are under-counted (drafts
# only get a little worse; decoding stays exact).
WALK_CAP = 512
RANK_FANOUT = 16  # states with more children than this walk them in count order (cached)


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
