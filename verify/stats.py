"""Per-step statistics and their aggregates (vocabulary of design.md).

tau: committed tokens per target verification forward (plain decoding: 1.0).
alpha: the per-token acceptance probability of the i.i.d. model behind
S(alpha, K, phi), estimated over the tokens actually checked: accepted /
(accepted + rejections), where a step ends in a rejection when its walk stopped
at a slot that still had draft children (not when the draft simply ran out).
Per-depth acceptance: the share of steps whose accepted path reached depth d.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    drafted: int  # nodes in the tree
    depth: int  # tree depth (longest root-to-leaf path)
    accepted: int  # accepted draft tokens (= depth reached)
    committed: int  # tokens committed this step (after EOS / budget truncation)
    draft_s: float
    verify_s: float
    prefill: bool = False  # the first forward over the prompt, which commits the first token
    budget_depth: int = 0  # the budget the policy gave this step
    budget_nodes: int = 0
    rejected: bool = False  # the acceptance walk stopped at a slot that had draft children
    lanes: int = 1  # sequences verified in the same forward (verify_s is this one's share of it)
    pruned: int = 0  # draft nodes a grammar forbade, dropped before the forward (not in `drafted`)
    forced: int = 0  # tokens a grammar forced after the bonus, committed without a forward (in `committed`)
    first_accepted: int = 0  # accepted nodes from the root while each was its parent's first child: what the
    # tree's chain would have accepted


@dataclass
class DecodeStats:
    steps: list[StepStats] = field(default_factory=list)
    grammar_complete: bool | None = None  # None: no grammar; False: max_new_tokens ended the output first

    @property
    def decode_steps(self) -> list[StepStats]:
        return [s for s in self.steps if not s.prefill]

    @property
    def new_tokens(self) -> int:
        return sum(s.committed for s in self.steps)

    @property
    def tau(self) -> float:
        steps = self.decode_steps
        return sum(s.accepted + 1 for s in steps) / len(steps) if steps else 1.0

    @property
    def tau_with_forced(self) -> float:
        """tau counting the tokens a grammar forced (jump-forward) as committed by the step before them."""
        steps = self.decode_steps
        return sum(s.accepted + 1 + s.forced for s in steps) / len(steps) if steps else 1.0

    @property
    def forced_tokens(self) -> int:
        return sum(s.forced for s in self.steps)

    @property
    def pruned_nodes(self) -> int:
        return sum(s.pruned for s in self.steps)

    @property
    def alpha(self) -> float:
        """accepted / (accepted + rejections) over the decode steps that drafted."""
        steps = [s for s in self.decode_steps if s.drafted]
        checked = sum(s.accepted + s.rejected for s in steps)
        return sum(s.accepted for s in steps) / checked if checked else 0.0

    def acceptance_by_depth(self, max_depth: int | None = None) -> list[float]:
        """[d-1] = share of decode steps whose accepted path reached depth d."""
        steps = self.decode_steps
        if not steps:
            return []
        top = max_depth or max((s.depth for s in steps), default=0)
        return [sum(s.accepted >= d for s in steps) / len(steps) for d in range(1, top + 1)]

    @property
    def draft_s(self) -> float:
        return sum(s.draft_s for s in self.steps)

    @property
    def verify_s(self) -> float:
        return sum(s.verify_s for s in self.steps)

    @property
    def mean_tree_size(self) -> float:
        steps = self.decode_steps
        return sum(s.drafted for s in steps) / len(steps) if steps else 0.0

    @property
    def mean_depth(self) -> float:
        steps = self.decode_steps
        return sum(s.depth for s in steps) / len(steps) if steps else 0.0

    @property
    def mean_budget(self) -> tuple[float, float]:
        """(mean budget depth, mean budget nodes) the policy gave over the decode steps."""
        steps = self.decode_steps
        if not steps:
            return 0.0, 0.0
        return (sum(s.budget_depth for s in steps) / len(steps), sum(s.budget_nodes for s in steps) / len(steps))

    def merge(self, other: "DecodeStats") -> "DecodeStats":
        flags = [f for f in (self.grammar_complete, other.grammar_complete) if f is not None]
        return DecodeStats(self.steps + other.steps, all(flags) if flags else None)

    def summary(self) -> dict:
        return {"tau": self.tau, "alpha": self.alpha, "acceptance_by_depth": self.acceptance_by_depth(),
                "steps": len(self.decode_steps), "new_tokens": self.new_tokens, "mean_tree_size": self.mean_tree_size,
                "mean_depth": self.mean_depth, "mean_budget": self.mean_budget,
                "draft_s": self.draft_s, "verify_s": self.verify_s, "tau_with_forced": self.tau_with_forced,
                "forced_tokens": self.forced_tokens, "pruned_nodes": self.pruned_nodes,
                "grammar_complete": self.grammar_complete}
