"""How much a drafter may draft each step: the budget policies the decoding loop asks.

A policy gives, before each step, a `Budget` (maximum depth and node count) no
larger than the drafter's own cap, and is told afterwards what the step cost
and what it committed. `FixedBudget` always gives the cap (experiments with
fixed settings); the cost-aware controller lives in verify/controller.py.
"""
from __future__ import annotations

from typing import Protocol

from verify.contract import Budget
from verify.stats import StepStats

#: the cap of a drafter that declares none
DEFAULT_CAP = Budget(max_depth=16, max_nodes=64)


def drafter_cap(drafter) -> Budget:
    """The drafter's configured maximum (`budget_cap`), or DEFAULT_CAP."""
    cap = getattr(drafter, "budget_cap", None)
    return cap if cap is not None else DEFAULT_CAP


class BudgetPolicy(Protocol):
    cap: Budget

    def start(self, prompt_len: int) -> None:
        """A new sequence begins."""

    def budget(self, context_len: int) -> Budget:
        """The budget for the next step (context_len: committed tokens so far)."""

    def observe(self, step: StepStats, context_len: int) -> None:
        """What the step drafted, accepted and cost."""


class FixedBudget:
    """Always the same budget."""

    def __init__(self, cap: Budget):
        self.cap = cap

    @classmethod
    def of(cls, drafter) -> "FixedBudget":
        return cls(drafter_cap(drafter))

    def start(self, prompt_len: int) -> None:
        pass

    def budget(self, context_len: int) -> Budget:
        return Budget(self.cap.max_depth, self.cap.max_nodes)

    def observe(self, step: StepStats, context_len: int) -> None:
        pass
