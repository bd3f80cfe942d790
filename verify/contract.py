"""The contract between drafters and the verifier.

A drafter proposes a `DraftTree` hanging off the root (the last committed
token) within the `Budget` it was given, the verifier checks it in one target
forward, and the drafter is told what was kept through a `StepResult`. This
module is owned by verify/; drafters/ import it, verify/ never imports a
concrete drafter.

Vocabulary (design.md): p is the target distribution, q the draft's. A chain
is a tree whose parents are [-1, 0, 1, ...].
"""
from __future__ import annotations

import numbers

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch

from draftkit.verify import sync

#: how the children of a node were drawn from q (the verifier picks its acceptance rule from this)
IID, WITHOUT_REPLACEMENT = "iid", "without_replacement"


class DraftMismatch(ValueError):
    """A draft made for another target (its hidden size, vocabulary or layer count differ), named in one line."""


@dataclass(frozen=True)
class SiblingDraws:
    """The draws behind each slot's children when one tree merges the proposals of several drafters
    that drew independently of each other (drafters/hybrid.py).

    order[s] (slot s: 0 = root, i + 1 = node i) lists the draws behind slot s's children in the
    order the verifier tests them, as (node, row, group):
      node:  the child node the draw proposed. A token proposed by several drafters is one node
             (the target verifies it once), listed once per draw and tested at each
      row:   the draw's distribution is q[row] (q: (m, V)); -1 is a deterministic draw (one-hot q)
      group: the drafter that drew it. The draws of one group at a slot are consecutive; they were
             drawn from q without replacement when without_replacement[group], else independently.
    Different groups drew independently of each other, so the verifier applies multi-step
    speculative sampling across them (SpecInfer) and recursive rejection sampling within a group
    that drew without replacement (verify/accept.py)."""

    order: list[list[tuple[int, int, int]]]
    q: torch.Tensor | None
    without_replacement: list[bool]

    def check(self, children: list[list[int]]) -> None:
        if len(self.order) != len(children):
            raise ValueError(f"SiblingDraws lists {len(self.order)} slots; the tree has {len(children)}")
        rows = 0 if self.q is None else self.q.shape[0]
        for s, draws in enumerate(self.order):
            if {node + 1 for node, _, _ in draws} != set(children[s]):
                raise ValueError(f"SiblingDraws of slot {s} name nodes {sorted(n for n, _, _ in draws)}, "
                                 f"its children are {sorted(c - 1 for c in children[s])}")
            groups = [g for _, _, g in draws]
            if any(g != h and g in groups[:i] for i, (g, h) in enumerate(zip(groups[1:], groups), 1)):
                raise ValueError(f"SiblingDraws of slot {s}: the draws of a group must be consecutive, got {groups}")
            if any(not -1 <= r < rows for _, r, _ in draws) or any(not 0 <= g < len(self.without_replacement)
                                                                    for g in groups):
                raise ValueError(f"SiblingDraws of slot {s}: a q row or group out of range in {draws}")


@dataclass
class DeviceTopology:
    """What a tree chosen on the device adds to its tokens, parents and extra (DraftTree.on_device_topology):
    depth (n,) long (root's children at depth 1); max_depth and max_children bound the tree (the host sizes the
    step's layout and acceptance tables from them)."""

    depth: torch.Tensor
    max_depth: int
    max_children: int


@dataclass
class DraftTree:
    """Draft nodes in topological order (a parent always comes before its child).

    tokens:  (n,) long   token of each node
    parents: (n,) long   index of each node's parent in `tokens`, -1 for a child of the root
    q:       (n, V) float or None: the distribution node i was drawn from (at its parent's
             position). None means every node is a deterministic proposal (one-hot q), as for
             greedy drafting, top-k trees and n-gram lookups; that keeps sampling lossless.
    draws:   IID (siblings drawn independently from q, SpecInfer) or WITHOUT_REPLACEMENT
             (siblings drawn from q without replacement; recursive rejection sampling)
    extra:   the drafter's own bookkeeping, handed back in StepResult.tree
    sibling_draws: None, or the draws of several independent drafters behind each slot's children
             (`SiblingDraws`, a merged tree); it then replaces q and draws for acceptance

    `validate()` runs once per step and keeps host copies of the topology (parents, depth,
    children), so nothing downstream reads the tensors back one node at a time. A tree chosen on the
    device (`on_device_topology`: EAGLE-2's top-k tree) has no host copies until the verifier's one read
    brings them (`resolve`); code that needs them earlier reads them then (one more wait).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None
    draws: str = IID
    extra: object = None
    sibling_draws: SiblingDraws | None = None
    _parents: list[int] | None = field(default=None, repr=False)
    _tokens: list[int] | None = field(default=None, repr=False)
    _children: list[list[int]] | None = field(default=None, repr=False)
    _depth: list[int] | None = field(default=None, repr=False)
    _ancestors: torch.Tensor | None = field(default=None, repr=False)
    device_topology: DeviceTopology | None = field(default=None, repr=False)  # until the step's read resolves it

    @staticmethod
    def empty(device=None) -> "DraftTree":
        return DraftTree.from_lists([], [], device)

    @staticmethod
    def from_lists(tokens: Sequence[int], parents: Sequence[int], device=None, q=None, draws: str = IID,
                   extra=None) -> "DraftTree":
        """A tree built on the host: the host copies are kept, so validation reads nothing back. Its tensors
        stay on the host (`device` is accepted for compatibility): the verifier uploads the tokens with the
        rest of the step in one copy and replaces `tokens` by that device copy."""
        tree = DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), q, draws,
                         extra)
        tree._tokens, tree._parents = list(tokens), list(parents)
        return tree

    @staticmethod
    def on_device(tokens: torch.Tensor, parents: Sequence[int], q=None, draws: str = IID, extra=None) -> "DraftTree":
        """A tree whose topology the host knows and whose tokens (n,) stay where the drafter made them: nothing is
        read to build it; the verifier feeds the tokens as they are and reads them with its one read."""
        tree = DraftTree(tokens, torch.tensor(parents, dtype=torch.long), q, draws, extra)
        tree._parents = list(parents)
        return tree

    @staticmethod
    def on_device_topology(tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, max_depth: int,
                           max_children: int, extra: torch.Tensor | None = None, q=None,
                           draws: str = IID) -> "DraftTree":
        """A tree chosen on the device: tokens, parents, depth (n,) long and the drafter's extra (n,) long (or
        None) stay there and nothing is read to build it. The host knows its size, a bound on its depth and on
        any node's children; the verifier lays the step out from the device tensors and reads the topology with
        its one read. q and draws as for any tree (None: deterministic nodes)."""
        tree = DraftTree(tokens, parents, q, draws, extra)  # extra stays a tensor until the read resolves it
        tree.device_topology = DeviceTopology(depth, max_depth, max_children)
        return tree

    @property
    def topology_on_device(self) -> bool:
        """The topology is on the device only (not yet resolved by a read)."""
        return self.device_topology is not None

    def payload(self) -> torch.Tensor:
        """(2n or 3n,) long on the device: parents, tokens and the extra, for the read that resolves them."""
        return torch.cat([self.parents, self.tokens] + ([] if self.extra is None else [self.extra]))

    @property
    def payload_len(self) -> int:
        return len(self) * (2 if self.extra is None else 3)

    def resolve(self, ints: Sequence[int]) -> "DraftTree":
        """The host copies from `payload()` read back; validates. Returns self."""
        n = len(self)
        self._parents, self._tokens = [int(x) for x in ints[:n]], [int(x) for x in ints[n:2 * n]]
        if self.extra is not None:
            self.extra = [int(x) for x in ints[2 * n:3 * n]]
        self.device_topology = None
        return self.validate()

    def _read_topology(self) -> None:
        """Resolve a device tree now: one read, for code that needs the host topology before the verifier's."""
        if self.device_topology is not None:
            self.resolve(sync.to_host(self.payload()))

    @staticmethod
    def chain(tokens: torch.Tensor | Sequence[int], q: torch.Tensor | None = None, device=None) -> "DraftTree":
        if isinstance(tokens, torch.Tensor):
            device = tokens.device if device is None else device
            tokens = tokens.tolist()
        return DraftTree.from_lists(tokens, list(range(-1, len(tokens) - 1)), device, q)

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def host_tokens(self) -> list[int]:
        self._read_topology()
        if self._tokens is None:
            self._tokens = self.tokens.tolist()
        return self._tokens

    def validate(self, vocab_size: int | None = None) -> "DraftTree":
        """Check shapes and topology; build children lists and depths on the host. Returns self."""
        if self.tokens.dim() != 1 or self.parents.shape != self.tokens.shape:
            raise ValueError(f"DraftTree tokens {tuple(self.tokens.shape)} and parents "
                             f"{tuple(self.parents.shape)} must be 1-D and of the same length")
        if self.draws not in (IID, WITHOUT_REPLACEMENT):
            raise ValueError(f"DraftTree draws must be {IID!r} or {WITHOUT_REPLACEMENT!r}, got {self.draws!r}")
        n = len(self)
        if self.device_topology is not None:  # checked where it was built (drafters/tree_search.py): reading it
            if self.sibling_draws is not None:  # here would cost the wait it saves
                raise ValueError("a DraftTree with its topology on the device cannot be a merged tree")
            if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != n):
                raise ValueError(f"DraftTree q must be (n={n}, V); got {tuple(self.q.shape)}")
            return self
        parents = self._parents if self._parents is not None else self.parents.tolist()
        children: list[list[int]] = [[] for _ in range(n + 1)]  # slot 0 = root, node i -> slot i + 1
        depth = [0] * (n + 1)
        for i, par in enumerate(parents):
            if not -1 <= par < i:
                raise ValueError(f"DraftTree node {i} has parent {par}: parents must point to an earlier "
                                 f"node (0..{i - 1}) or be -1 for the root")
            children[par + 1].append(i + 1)
            depth[i + 1] = depth[par + 1] + 1
        if self._tokens is None and sync.is_host(self.tokens.device):  # free on the host; a device tree is
            self._tokens = self.tokens.tolist()  # read once, with the acceptance rule's one read
        if vocab_size is not None and self._tokens is not None and self._tokens \
                and not (0 <= min(self._tokens) and max(self._tokens) < vocab_size):
            raise ValueError(f"DraftTree tokens must lie in [0, {vocab_size}); got {self._tokens}")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != n):
            raise ValueError(f"DraftTree q must be (n={n}, V); got {tuple(self.q.shape)}")
        if self.sibling_draws is not None:
            self.sibling_draws.check(children)
        self._parents, self._children, self._depth = parents, children, depth
        return self

    @property
    def host_parents(self) -> list[int]:
        self._read_topology()
        if self._parents is None:
            self.validate()
        return self._parents

    @property
    def children(self) -> list[list[int]]:
        """children[s] are the slots under slot s (slot 0 = root, slot i + 1 = node i)."""
        self._read_topology()
        if self._children is None:
            self.validate()
        return self._children

    @property
    def depth(self) -> list[int]:
        """depth[s] of each slot, root 0."""
        self._read_topology()
        if self._depth is None:
            self.validate()
        return self._depth

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def first_children(self, path: Sequence[int]) -> int:
        """How many nodes of an accepted path (node indices from the root down) are, from the root on, each
        their parent's first child: what this tree's chain of first children would have accepted."""
        n = 0
        for i in path:
            if self.children[self.host_parents[i] + 1][0] != i + 1:
                break
            n += 1
        return n

    @property
    def is_chain(self) -> bool:
        """Node i's parent is i - 1 for every i (the empty tree included)."""
        return all(p == i - 1 for i, p in enumerate(self.host_parents))

    @property
    def ancestors(self) -> torch.Tensor:
        """(n, n) bool on the tokens' device: [i, j] is True when node j is node i or one of its
        ancestors. Built by walking every node up one level at a time: max-depth vector ops."""
        if self._ancestors is None:
            n = len(self)
            par = torch.tensor(self.host_parents, dtype=torch.long)
            anc = torch.eye(n, dtype=torch.bool)
            rows, up = torch.arange(n), par.clone()
            for _ in range(self.max_depth - 1):
                live = up >= 0
                if not bool(live.any()):
                    break
                anc[rows[live], up[live]] = True
                up[live] = par[up[live]]
            self._ancestors = anc.to(self.tokens.device)
        return self._ancestors


def require_int(name: str, value) -> None:
    """A TypeError naming `name` unless value is an integer (bool is not one): what a count or an id must be."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")


def first_line(message) -> str:
    """The first line of an error or warning (its class name when it has no text): how the project reports
    another library's multi-line messages in one line."""
    text = str(message).strip()
    return text.splitlines()[0] if text else type(message).__name__


@dataclass
class Budget:
    """How much a drafter may propose this step: at most max_depth levels and max_nodes nodes.
    Budget(0, 0) asks for a plain step (an empty tree). min_path_prob: drafters that know their
    paths' draft probability (EAGLE-2 and standalone trees) need not expand a path below it:
    one more depth there costs more than it is expected to return.
    fixed: the caller asked for this budget at every step (budget="fixed"): a drafter must not shrink it on
    its own measured timings, so that one seed reproduces a sample."""

    max_depth: int
    max_nodes: int
    min_path_prob: float = 0.0
    fixed: bool = False

    def __post_init__(self):
        if self.max_depth < 0 or self.max_nodes < 0:
            raise ValueError(f"a budget needs max_depth >= 0 and max_nodes >= 0, got {self}")

    @property
    def empty(self) -> bool:
        return self.max_depth == 0 or self.max_nodes == 0

    def clip(self, remaining: int) -> "Budget":
        """No deeper than the tokens still allowed minus the bonus token."""
        depth = max(0, min(self.max_depth, remaining - 1))
        return Budget(depth, self.max_nodes if depth else 0, self.min_path_prob, self.fixed)


@dataclass
class DecodeState:
    """What a drafter may read when proposing.

    tokens:    (T,) long  all committed tokens (prompt + generated); tokens[-1] is the root
    prompt_len: length of the prompt at the start of tokens
    budget:    the depth and node budget for this step (already clipped to the tokens left)
    greedy:    True when acceptance is greedy (drafters may then skip computing q)
    temperature: the sampling temperature of p; a sampled draft is most often accepted when its
               q uses the same one
    sampling:  the whole sampling setting of p (verify.accept.Sampling: temperature, top-k, top-p),
               so that a sampled q can be processed the same way; None under greedy
    generator: the random stream every draft draw must use (on the target's device; drafters on
               another device derive theirs from it), seeded from the run's seed: one seed then
               reproduces the drafter's draws and the verifier's. None: torch's global generator
    """

    tokens: torch.Tensor
    prompt_len: int
    budget: Budget
    greedy: bool
    temperature: float = 1.0
    sampling: object = None
    generator: torch.Generator | None = None


@dataclass
class StepResult:
    """What one verification step kept, for `Drafter.update`.

    new_tokens:   (m,) long  tokens committed this step (accepted + bonus)
    fed_tokens:   (k,) long  the tokens whose target entries were kept: the prefix fed this step
                  plus the accepted nodes; new_tokens[-1] (the bonus) is the next root
    hidden:       one (k, H) tensor per layer the drafter asked for (`hidden_layers`, same order)
                  at the kept positions, or None when it asked for none
    logits:       (n + 1, V) target logits at the root slot and at every node (unprocessed)
    tree, accepted: the tree that was verified (with its .extra) and the accepted node indices
    top1, new_token_ids: host copies the loop read anyway (argmax p per row, the new tokens)
    forced:       how many of new_tokens (the last ones) a grammar forced: committed after the bonus without
                  a forward (jump-forward), they lead the next step's fed_tokens
    """

    new_tokens: torch.Tensor
    fed_tokens: torch.Tensor
    hidden: tuple[torch.Tensor, ...] | None
    logits: torch.Tensor
    tree: DraftTree
    accepted: list[int]
    top1: list[int] | None = None  # argmax of `logits` per row, read with the step's result (no extra read)
    new_token_ids: list[int] | None = None  # new_tokens on the host
    forced: int = 0

    @property
    def new_token_list(self) -> list[int]:
        """new_tokens as host ints, without a device read when the loop already has them."""
        return self.new_token_ids if self.new_token_ids is not None else self.new_tokens.tolist()


OUTLOOK_LEVELS = 5  # Drafter.outlook() values: 0 (no signal) .. 4


@runtime_checkable
class Drafter(Protocol):
    """A drafting method. Three calls: reset for a new prompt, propose, update."""

    #: indices into transformers' hidden_states tuple (0 = embeddings, -1 = the last, after the
    #: final norm) that the verifier returns at the kept positions; () asks for none
    hidden_layers: tuple[int, ...]

    def reset(self, prompt: torch.Tensor) -> None:
        """Forget everything about the previous sequence; `prompt` is (T,) long."""

    def propose(self, state: DecodeState) -> DraftTree:
        """A draft tree hanging off state.tokens[-1], within state.budget. May be empty."""

    def update(self, result: StepResult) -> None:
        """Learn what the target kept (roll back caches, store features, harvest n-grams)."""

    # optional: warm() -> None, compile now what drafting alone will run (verify/lanes.py `forming_lanes`)
    # optional: outlook() -> int, asked before each step's budget: how far this step's draft should pass, as the
    #   drafter can tell before drafting (suffix: the length of its match), 0 (no such signal) to OUTLOOK_LEVELS - 1.
    #   The controller keeps pass rates per outlook (verify/controller.py)
    # optional, on the class: draft_lanes(drafters) -> DraftLanes | None (verify/lanes.py)


class NoDrafter:
    """Plain autoregressive decoding: always the empty tree."""

    hidden_layers: tuple[int, ...] = ()
    budget_cap = Budget(0, 0)

    def reset(self, prompt: torch.Tensor) -> None:
        pass

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.empty(state.tokens.device)

    def update(self, result: StepResult) -> None:
        pass
