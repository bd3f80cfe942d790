"""How much a drafter may draft each step: the budget policies the decoding loop asks.

A policy gives, before each step, a `Budget` (maximum depth and node count) no
larger than the drafter's own cap, and is told afterwards what the step cost
and what it committed. `FixedBudget` always gives the cap (experiments with
fixed settings); the cost-aware controller lives in verify/controller.py.
`make_policy` turns the names users pass ("auto", "fixed") into a policy.
"""
from __future__ import annotations

from typing import Protocol

from draftkit.verify.contract import Budget
from draftkit.verify.stats import StepStats

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
        return Budget(self.cap.max_depth, self.cap.max_nodes, fixed=True)

    def observe(self, step: StepStats, context_len: int) -> None:
        pass


def make_policy(spec, drafter, model) -> BudgetPolicy:
    """"auto" (the cost-aware controller; the default), "fixed" (the drafter's cap every step), a Budget (that budget
    every step, within the drafter's cap) or a policy object. A drafter's auto policy is kept on the drafter, so
    what it learned about the drafter's acceptance and cost carries over from one generate call to the next."""
    if spec is None or spec == "auto":
        cap = drafter_cap(drafter)
        if cap.empty:
            return FixedBudget(cap)
        policy = getattr(drafter, "_auto_budget", None)
        if policy is None or policy.model is not model or policy.cap != cap:
            from draftkit.verify.controller import AutoBudget

            policy = AutoBudget(model, cap, outlook=getattr(drafter, "outlook", None))
            try:
                drafter._auto_budget = policy
            except AttributeError:  # a drafter with __slots__: no memory across calls
                pass
        return policy
    if spec == "fixed":
        return FixedBudget.of(drafter)
    if isinstance(spec, Budget):
        cap = drafter_cap(drafter)
        return FixedBudget(Budget(min(spec.max_depth, cap.max_depth), min(spec.max_nodes, cap.max_nodes)))
    if isinstance(spec, str):
        raise ValueError(f"budget must be 'auto', 'fixed', a Budget or a budget policy, got {spec!r}")
    if not all(callable(getattr(spec, m, None)) for m in ("start", "budget", "observe")) or isinstance(spec, type):
        raise TypeError(f"budget must be 'auto', 'fixed', a Budget or a budget policy (start, budget, observe), got "
                        f"{spec!r}")
    return spec
