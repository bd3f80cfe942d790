"""The contract between drafters and the verifier.

A drafter proposes a `DraftTree` hanging off the root (the last committed
token), the verifier checks it in one target forward, and the drafter is told
what was kept through a `StepResult`. verify/ only ever sees this Protocol;
it never imports a concrete drafter.

Vocabulary (design.md): p is the target distribution, q the draft's. A chain
is a tree whose parents are [-1, 0, 1, ...].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass
class DraftTree:
    """Draft nodes in topological order (a parent always comes before its child).

    tokens:  (n,) long   token of each node
    parents: (n,) long   index of each node's parent in `tokens`, -1 for a child of the root
    q:       (n, V) float or None: the distribution node i was drawn from (at its parent's
             position). None means every node is a deterministic proposal (one-hot q), as for
             greedy drafting, top-k trees and n-gram lookups; that keeps sampling lossless.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None
    extra: object = None  # drafter's own bookkeeping, handed back in StepResult.tree
    # Python-side copies for the acceptance walk, filled by validate() (no per-node .item()).
    _children: list[list[int]] | None = field(default=None, repr=False)
    _depth: list[int] | None = field(default=None, repr=False)

    @staticmethod
    def empty(device=None) -> "DraftTree":
        z = torch.zeros(0, dtype=torch.long, device=device)
        return DraftTree(z, z.clone())

    @staticmethod
    def chain(tokens: torch.Tensor, q: torch.Tensor | None = None) -> "DraftTree":
        n = tokens.numel()
        return DraftTree(tokens.long(), torch.arange(-1, n - 1, device=tokens.device), q)

    def __len__(self) -> int:
        return self.tokens.numel()

    def validate(self, vocab_size: int | None = None) -> "DraftTree":
        """Check shapes and topology; build children lists and depths. Returns self."""
        if self.tokens.dim() != 1 or self.parents.shape != self.tokens.shape:
            raise ValueError(f"DraftTree tokens {tuple(self.tokens.shape)} and parents "
                             f"{tuple(self.parents.shape)} must be 1-D and of the same length")
        n = len(self)
        parents = self.parents.tolist()
        children: list[list[int]] = [[] for _ in range(n + 1)]  # slot 0 = root, node i -> slot i + 1
        depth = [0] * (n + 1)
        for i, par in enumerate(parents):
            if not -1 <= par < i:
                raise ValueError(f"DraftTree node {i} has parent {par}: parents must point to an earlier "
                                 f"node (0..{i - 1}) or be -1 for the root")
            children[par + 1].append(i + 1)
            depth[i + 1] = depth[par + 1] + 1
        if vocab_size is not None and n and not (0 <= int(self.tokens.min()) and int(self.tokens.max()) < vocab_size):
            raise ValueError(f"DraftTree tokens must lie in [0, {vocab_size}); got {self.tokens.tolist()}")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != n):
            raise ValueError(f"DraftTree q must be (n={n}, V); got {tuple(self.q.shape)}")
        self._children, self._depth = children, depth
        return self

    @property
    def children(self) -> list[list[int]]:
        """children[s] are the slots under slot s (slot 0 = root, slot i + 1 = node i)."""
        if self._children is None:
            self.validate()
        return self._children

    @property
    def depth(self) -> list[int]:
        """depth[s] of each slot, root 0."""
        if self._depth is None:
            self.validate()
        return self._depth


@dataclass
class DecodeState:
    """What a drafter may read when proposing.

    tokens:   (T,) long  all committed tokens (prompt + generated); tokens[-1] is the root
    budget:   tokens still allowed; a tree deeper than budget - 1 wastes work
    greedy:   True when acceptance is greedy (drafters may then skip computing q)
    temperature: the sampling temperature of p; a sampled draft is most often accepted when its
              q uses the same one
    """

    tokens: torch.Tensor
    prompt_len: int
    budget: int
    greedy: bool
    temperature: float = 1.0


@dataclass
class StepResult:
    """What one verification step kept, for `Drafter.update`.

    new_tokens:   (m,) long  tokens committed this step (accepted + bonus)
    fed_tokens:   (k,) long  the tokens whose target entries were kept: the prefix fed this step
                  plus the accepted nodes; new_tokens[-1] (the bonus) is the next root
    hidden:       tuple of (k, H) per layer (embeddings first, as transformers returns them) at
                  the kept positions, or None when the drafter did not ask for hidden states
    logits:       (n + 1, V) target logits at the root slot and at every node (unprocessed)
    tree, accepted: the tree that was verified (with its .extra) and the accepted node indices
    """

    new_tokens: torch.Tensor
    fed_tokens: torch.Tensor
    hidden: tuple[torch.Tensor, ...] | None
    logits: torch.Tensor
    tree: DraftTree
    accepted: list[int]


@runtime_checkable
class Drafter(Protocol):
    """A drafting method. Three calls: reset for a new prompt, propose, update."""

    #: ask the verifier for the target's hidden states (feature drafters: Medusa, EAGLE)
    needs_hidden_states: bool

    def reset(self, prompt: torch.Tensor) -> None:
        """Forget everything about the previous sequence; `prompt` is (T,) long."""

    def propose(self, state: DecodeState) -> DraftTree:
        """A draft tree hanging off state.tokens[-1]. May be empty."""

    def update(self, result: StepResult) -> None:
        """Learn what the target kept (roll back caches, store features, harvest n-grams)."""


class NoDrafter:
    """Plain autoregressive decoding: always the empty tree."""

    needs_hidden_states = False

    def reset(self, prompt: torch.Tensor) -> None:
        pass

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.empty(state.tokens.device)

    def update(self, result: StepResult) -> None:
        pass
