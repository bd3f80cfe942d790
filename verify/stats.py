"""Per-step statistics and their aggregates (vocabulary of design.md).

tau: committed tokens per target verification forward (plain decoding: 1.0).
alpha: accepted draft tokens / drafted tokens, counted along chains; for trees
the share of depth-d levels reached is the per-depth acceptance instead.
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


@dataclass
class DecodeStats:
    steps: list[StepStats] = field(default_factory=list)

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
    def alpha(self) -> float:
        """Accepted / offered draft depth: per step min(depth, accepted + 1) draft tokens were checked."""
        offered = sum(s.depth for s in self.decode_steps)
        return sum(s.accepted for s in self.decode_steps) / offered if offered else 0.0

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

    def merge(self, other: "DecodeStats") -> "DecodeStats":
        return DecodeStats(self.steps + other.steps)

    def summary(self) -> dict:
        return {"tau": self.tau, "alpha": self.alpha, "acceptance_by_depth": self.acceptance_by_depth(),
                "steps": len(self.decode_steps), "new_tokens": self.new_tokens, "mean_tree_size": self.mean_tree_size,
                "draft_s": self.draft_s, "verify_s": self.verify_s}
