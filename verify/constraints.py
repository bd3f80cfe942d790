"""Constraints under speculation: logits processors and grammars applied to p at every tree node.

A constraint is part of p. Plain constrained decoding computes, at each position, the
target's logits, runs the logits processors on them with the sequence so far as
input_ids (transformers' `generate` order: the processors in list order, on float32
logits), masks the tokens the grammar forbids after the sequence so far, and only then
applies temperature / top-k / top-p (verify/accept.py). Here every tree slot gets the
same treatment with its own prefix: input_ids = committed tokens + the slot's path, and
the grammar's mask after that path. Acceptance and the bonus token then use that p, so
the output is exactly plain constrained decoding's (which is the same loop with the
empty tree).

What a grammar saves:
- pruning: a node the grammar forbids can never be accepted, so it and its subtree are
  not forwarded. With a sampled q (tree.q given) a forbidden node still shapes its
  later siblings' residual p (max(p - q, 0)), so acceptance keeps it as a leaf with a
  stand-in row (its parent's: never read, as p(node) = 0); with one-hot q it changes
  nothing and is dropped from acceptance too.
- jump-forward: where the grammar allows exactly one token, that token has p = 1, so it
  is committed without a forward and fed with the next step's prefix.

Nothing here runs without a processor or a grammar: the loop keeps `constraint = None`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftkit.verify.accept import accept
from draftkit.verify.contract import DraftTree, SiblingDraws
from draftkit.verify.grammar import Grammar, GrammarError, TreeMatcher, compile_grammar, xgrammar

# transformers processors that are a function of one row's input_ids and scores, nothing else: they can run
# per node with a batch of nodes as the batch. A processor of one's own opts in with `draftkit_rowwise = True`.
ROWWISE = ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "TemperatureLogitsWarper",
           "RepetitionPenaltyLogitsProcessor", "TopPLogitsWarper", "TopKLogitsWarper", "TopHLogitsWarper",
           "MinPLogitsWarper", "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper",
           "NoRepeatNGramLogitsProcessor", "SequenceBiasLogitsProcessor", "NoBadWordsLogitsProcessor",
           "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "InfNanRemoveLogitsProcessor",
           "ExponentialDecayLengthPenalty", "LogitNormalization", "SuppressTokensAtBeginLogitsProcessor",
           "SuppressTokensLogitsProcessor")
# of those, the ones whose -inf decisions depend on input_ids only (not on the other tokens' scores): with
# only these, a token the grammar forces can be checked against the processors without the model's logits
BANS_BY_IDS = ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "TemperatureLogitsWarper",
               "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor", "SequenceBiasLogitsProcessor",
               "NoBadWordsLogitsProcessor", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
               "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty", "LogitNormalization",
               "SuppressTokensAtBeginLogitsProcessor", "SuppressTokensLogitsProcessor")


def _kinds(processor) -> set[str]:
    return {c.__name__ for c in type(processor).__mro__}


def check_processors(processors) -> list:
    """The processors as a list, or a ValueError (one line) naming the first one that cannot run per node."""
    if processors is None:
        return []
    if callable(processors) and not isinstance(processors, (list, tuple)):  # one processor, not in a list
        processors = [processors]
    processors = list(processors)
    for proc in processors:
        if not callable(proc):
            raise TypeError(f"logits_processor holds {type(proc).__name__}, which is not callable")
        if getattr(proc, "draftkit_rowwise", False) or _kinds(proc) & set(ROWWISE):
            continue
        raise ValueError(f"logits processor {type(proc).__name__} is not supported under speculation: it is not "
                         "known to depend on one sequence's input_ids and scores only (beams, the batch, a step "
                         "counter or a model of its own); set draftkit_rowwise = True on a processor of your own that "
                         "does")
    return processors


def slot_paths(tree: DraftTree) -> list[list[int]]:
    """The tokens from the root (excluded) down to each slot (slot 0 = the root: [])."""
    paths, tokens = [[]], tree.host_tokens
    for i, par in enumerate(tree.host_parents):
        paths.append(paths[par + 1] + [tokens[i]])
    return paths


def process_slots(processors: list, committed: torch.Tensor, tree: DraftTree, scores: torch.Tensor) -> torch.Tensor:
    """scores (n + 1, V) float32 at every slot -> the processors' output, each slot with input_ids = committed (T,)
    + its path. Slots of one depth share a length, so each depth is one batched call per processor."""
    paths = slot_paths(tree)
    by_depth: dict[int, list[int]] = {}
    for s, path in enumerate(paths):
        by_depth.setdefault(len(path), []).append(s)
    out = torch.empty_like(scores)
    for d, slots in by_depth.items():
        ids = committed.expand(len(slots), -1)  # (k, T)
        if d:
            ids = torch.cat([ids, torch.tensor([paths[s] for s in slots], device=committed.device)], 1)  # (k, T + d)
        rows = torch.tensor(slots, device=scores.device)
        x = scores.index_select(0, rows)
        for proc in processors:
            x = proc(ids, x)
        out[rows] = x
    return out


@dataclass
class ConstrainedStep:
    """One step's tree under the grammar: what is forwarded, what acceptance walks, and the maps between them.

    tree:     the drafter's tree (n nodes); forward_tree: its nodes the grammar allows (n_f); walk_tree: what
              acceptance walks: the forward tree's nodes plus, when q is given, the forbidden children of
              allowed slots as leaves
    walk_nodes[j]: the drafter's index of walk node j; forward_of[j]: its forward index (-1: forbidden)
    walk_rows[s]:  the forward slot whose p walk slot s uses (a forbidden leaf: its parent's)
    masks:    (n_f + 1, W) int32 grammar bitmask per forward slot, or None without a grammar
    committed: (T,) the committed tokens (the processors' input_ids start with them)
    """

    tree: DraftTree
    forward_tree: DraftTree
    walk_tree: DraftTree
    walk_nodes: list[int] | None = None  # None: all three trees are the drafter's
    forward_of: list[int] | None = None
    walk_rows: list[int] | None = None
    masks: torch.Tensor | None = None
    committed: torch.Tensor | None = None
    processors: list = field(default_factory=list)
    pruned: int = 0

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """(n_f + 1, V) target logits of the forward -> (walk slots, V) constrained float32 logits."""
        scores = logits.to(torch.float32, copy=True)
        if self.processors:
            scores = process_slots(self.processors, self.committed, self.forward_tree, scores)
        if self.masks is not None:
            xgrammar().apply_token_bitmask_inplace(scores, self.masks.to(scores.device), vocab_size=scores.shape[-1])
        if self.walk_rows is not None:
            scores = scores.index_select(0, torch.tensor(self.walk_rows, device=scores.device))
        return scores

    def walk(self, logits: torch.Tensor, sampling, gen, width: int):
        """The acceptance walk over the constrained p: logits (n_f + 1, V) of the forward tree's root slot and
        nodes -> a verify.step.Walk over FORWARD indices (what the KV commit, the token buffer and the hidden rows
        index), path padded to `width`. The acceptance runs on the walk tree on its own (one upload and one read
        more than an unconstrained lane)."""
        from draftkit.verify.step import Walk

        accepted, bonus = accept(self.walk_tree, self.scores(logits), sampling, gen)
        forward = accepted if self.walk_nodes is None else [self.forward_of[j] for j in accepted]
        if min(forward, default=0) < 0:
            raise RuntimeError("a token the grammar forbids was accepted: the logits processors and the grammar "
                               "together left no token allowed at this position")
        tokens = self.forward_tree.host_tokens
        pad = [-1] * (width - len(forward))
        host = torch.tensor([len(forward), bonus] + forward + pad + [tokens[f] for f in forward] + pad)
        dev = host.to(logits.device)
        return Walk(dev[0], dev[2:2 + width], dev[2 + width:2 + 2 * width], dev[1])

    def drafter_nodes(self, forward: list[int]) -> list[int]:
        """Accepted forward indices -> the drafter's node indices."""
        return forward if self.walk_nodes is None else [_forward_nodes(self)[f] for f in forward]

    def drafter_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(n + 1, V) rows per drafter slot for StepResult.logits (a pruned node: its nearest forwarded ancestor's)."""
        if self.walk_nodes is None:
            return logits
        row = [0] * (len(self.tree) + 1)
        fwd_slot = {node: f + 1 for f, node in enumerate(_forward_nodes(self))}
        for i, par in enumerate(self.tree.host_parents):
            row[i + 1] = fwd_slot.get(i, row[par + 1])
        return logits.index_select(0, torch.tensor(row, device=logits.device))


def _forward_nodes(step: ConstrainedStep) -> list[int]:
    return [node for node, f in zip(step.walk_nodes, step.forward_of) if f >= 0]


def subtree(tree: DraftTree, nodes: list[int], q: bool) -> tuple[DraftTree, dict[int, int]]:
    """The tree of `nodes` (closed under parents, in order) and the map drafter index -> new index; with its q
    rows (or its merged sibling draws) when `q` and the tree has them."""
    index = {node: j for j, node in enumerate(nodes)}
    tokens, parents = tree.host_tokens, tree.host_parents
    rows = None
    if q and tree.q is not None:
        rows = tree.q[torch.tensor(nodes, dtype=torch.long, device=tree.q.device)]
    sub = DraftTree.from_lists([tokens[i] for i in nodes],
                               [index[parents[i]] if parents[i] >= 0 else -1 for i in nodes],
                               tree.tokens.device, q=rows, draws=tree.draws)
    draws = tree.sibling_draws
    if q and draws is not None:  # each kept slot's draws, renamed (a slot keeps all its children or none)
        order = [[(index[node], row, group) for node, row, group in draws.order[slot] if node in index]
                 for slot in [0] + [i + 1 for i in nodes]]
        sub.sibling_draws = SiblingDraws(order, draws.q, draws.without_replacement)
    return sub.validate(), index


def prune(tree: DraftTree, masks: torch.Tensor, committed: torch.Tensor, processors: list) -> ConstrainedStep:
    """Split `tree` by the grammar's slot masks (n + 1, W) into the forward and the acceptance trees."""
    tokens, parents = tree.host_tokens, tree.host_parents
    tok = torch.tensor(tokens)
    bits = ((masks[torch.tensor(parents) + 1, tok >> 5] >> (tok & 31)) & 1).tolist()  # node allowed after its parent
    ok: list[bool] = []
    for i, par in enumerate(parents):
        ok.append(bool(bits[i]) and (par < 0 or ok[par]))
    if all(ok):
        return ConstrainedStep(tree, tree, tree, masks=masks, committed=committed, processors=processors)
    forward = [i for i in range(len(tree)) if ok[i]]
    sampled = tree.q is not None or tree.sibling_draws is not None  # draws whose rejection shapes the residual
    walk = [i for i, par in enumerate(parents) if ok[i] or (sampled and (par < 0 or ok[par]))]
    forward_tree, f_index = subtree(tree, forward, q=False)
    walk_tree, _ = subtree(tree, walk, q=True)
    forward_of = [f_index.get(i, -1) for i in walk]
    rows = [0] + [f_index[i] + 1 if ok[i] else (f_index[parents[i]] + 1 if parents[i] >= 0 else 0) for i in walk]
    keep_rows = torch.tensor([0] + [i + 1 for i in forward])
    return ConstrainedStep(tree, forward_tree, walk_tree, walk, forward_of, rows, masks.index_select(0, keep_rows),
                           committed, processors, pruned=len(tree) - len(forward))


@dataclass
class Constraint:
    """One sequence's constraint: logits processors and/or a grammar matcher, and whether to jump forward."""

    processors: list = field(default_factory=list)
    matcher: TreeMatcher | None = None
    jump_forward: bool = True

    def __post_init__(self):
        # a forced token is checked against the processors on a stand-in row: exact only for processors whose
        # bans depend on input_ids alone
        self.jump_forward = self.jump_forward and self.matcher is not None and all(
            _kinds(p) & set(BANS_BY_IDS) for p in self.processors)

    def prepare(self, tree: DraftTree, committed: torch.Tensor) -> ConstrainedStep:
        """Before the forward: the grammar's masks over the tree and the nodes it forbids (dropped)."""
        if self.matcher is None:
            return ConstrainedStep(tree, tree, tree, committed=committed, processors=self.processors)
        masks = self.matcher.slot_masks(tree.host_tokens, tree.children)
        if not len(tree):
            return ConstrainedStep(tree, tree, tree, masks=masks, committed=committed, processors=self.processors)
        return prune(tree, masks, committed, self.processors)

    def commit(self, committed: torch.Tensor, new: list[int], remaining: int, eos: set[int]) -> list[int]:
        """Advance the grammar by the step's committed tokens `new` (committed: the tokens before them); return
        the tokens it then forces, one at a time, up to `remaining` in all and through an EOS (none once `new`
        reached either)."""
        if self.matcher is None:
            return []
        self.matcher.advance(new)
        forced: list[int] = []
        while self.jump_forward and len(new) + len(forced) < remaining and not (eos & set(new + forced)):
            token = self.matcher.forced()
            if token is None or not self._processors_keep(committed, new + forced, token):
                break
            self.matcher.advance([token])
            forced.append(token)
        return forced

    def _processors_keep(self, committed: torch.Tensor, new: list[int], token: int) -> bool:
        """Would the processors leave `token` finite after committed + new? (Decided by input_ids alone.)"""
        if not self.processors:
            return True
        ids = torch.cat([committed, torch.tensor(new, device=committed.device)])[None]
        row = torch.full((1, self.matcher.vocab_size), float("-inf"), device=committed.device)
        row[0, token] = 0.0
        for proc in self.processors:
            row = proc(ids, row)
        return bool(torch.isfinite(row[0, token]))

    @property
    def grammar_complete(self) -> bool | None:
        return None if self.matcher is None else self.matcher.completed


def as_grammar(grammar) -> Grammar:
    if isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, dict):
        return Grammar.json_schema(grammar)
    raise TypeError(f"grammar must be a draftkit Grammar (Grammar.json_schema / .regex / .ebnf) or a JSON schema "
                    f"dict, got {type(grammar).__name__}: a string could be a schema, a regex or a grammar")


def make_constraint(logits_processor, grammar, tokenizer, vocab_size: int, eos: set[int],
                    jump_forward: bool = True) -> Constraint | None:
    """The sequence's Constraint, or None when there is neither a processor nor a grammar (the unconstrained
    loop then runs unchanged). Raises ValueError / GrammarError / TypeError (one line) on bad input."""
    processors = check_processors(logits_processor)
    if grammar is None:
        return Constraint(processors, None, False) if processors else None
    compiled = compile_grammar(as_grammar(grammar), tokenizer, vocab_size, eos)
    return Constraint(processors, TreeMatcher(compiled, vocab_size), jump_forward)


__all__ = ["Constraint", "ConstrainedStep", "Grammar", "GrammarError", "check_processors", "make_constraint",
           "process_slots"]
