"""Budgets for the lanes of one packed step, chosen together.

Each lane's controller (verify/controller.py) prices its nodes as if its tree were the step's only one: from
one sequence's cost curve, where the first nodes ride on a forward that is mostly overhead. In a batch every
lane's tree joins ONE forward whose rows are already many (8 lanes: 8 rows before any node), so the nodes of
eight lanes that each think they are nearly free make the forward several times dearer, and every lane waits
for it. Chosen lane by lane, drafters that pay at batch 4 lost at batch 8 (lookahead 0.72x at tau 2.07).

Model of a packed step with L live lanes, lane i drafting depth D_i (N_i(D_i) nodes, its tree shape, or for a
tree drafter its chain, N = D: each lane's options are both, verify/controller.py):

    committed   E = sum_i (1 + sum_{d=1..D_i} R_{i,d})          (R: the lane's AcceptanceModel.reach)
    seconds     T = f(q) + sum_i draft_i(D_i)                   q = sum_i (pending_i + N_i(D_i))

draft_i: the lane's fitted drafting time (its share of its group's, where lanes draft together); f(q):
the target forward over q rows, a line fitted to the batch's drafting steps (decayed least squares; a packed
forward on a CPU grows by a near-constant cost per row once its rows are many) and, until the steps spread
enough to fit one, the lanes' profile curve f(q) = plain_s * c(q - 1) scaled by what the steps measured. The
all-plain step is priced by what the last all-plain steps measured at that size, not by the line: fitted over
drafting steps of many rows, the line overstates a step of one row per lane (batch 32, DFlash: 58.7 ms
extrapolated against 48 ms measured, so drafting at tau 2.2 looked 10% better than plain and ran 7% slower).
A batch is done when its last lane is: a token committed by a lane far ahead of the others shortens nothing
(measured: lookahead at tau 1.8 took 54 steps where plain decoding took 63, its lanes finishing unevenly, and
lost 32% for trees that every lane paid for). So lane i's committed tokens are weighted by how close it is to
being the last to finish: w_i = s_i / max_j s_j, s_i = its tokens left / its committed tokens per step so
far. Lanes behind draft deep; lanes ahead stop drafting and stop making every lane's forward dearer; with
lanes alike (or continuous batching, where every token counts) every w_i is 1.

The plan maximizes sum_i w_i E_i / T (Dinkelbach): for a throughput guess lam, each lane alone maximizes
w_i E_i(D) - lam * (f'(q) N_i(D) + draft_i(D)), with f linearized at the previous guess's q; lam <- the
objective of that choice. The best choice of a few rounds, all-plain included, is kept, so the plan is never
worse than plain decoding by its own model; and, as for one sequence, a plan that beats all-plain by less than
DRAFT_MARGIN is no gain (the best of several estimated rates is biased upward): the lanes then step plain.

In the rows layout (a KV row per lane, verify/forward.py) the forward is a (L, width) batch: it costs
f(L * width), width = max_i (pending_i + N_i), and a lane's nodes are free up to the widest lane's rows. The plan
then tries every width: at each, every lane takes its best option that fits (the option maximizing
w_i E_i - lam * draft_i, lam the best rate so far), and the width of the best rate wins.
"""
from __future__ import annotations

from draftkit.verify.contract import Budget
from draftkit.verify.controller import DRAFT_MARGIN, AutoBudget
from draftkit.verify.estimates import DecayedLine

ROUNDS = 4  # Dinkelbach rounds per step (converges in 2-3; each is L x depth evaluations)
MIN_FIT_STEPS = 4  # steps (decayed count) before the fitted line replaces the scaled profile


class BatchPlanner:
    """One per packed decoding; `budgets` before each step, `observe` after it."""

    def __init__(self, policies: list[AutoBudget], rows: bool = False):
        self.policies, self.rows = policies, rows  # rows: the forward pads every lane to the widest (module notes)
        self.line = DecayedLine(keep=0.9)  # forward seconds against rows, this run's drafting steps
        self.scale: float | None = None  # measured / profiled forward seconds of this run's steps (EMA)
        self.plain: tuple[int, float] | None = None  # (rows, seconds as an EMA) of the last all-plain steps

    @classmethod
    def over(cls, policies, rows: bool = False) -> "BatchPlanner | None":
        """A planner when every lane runs the cost-aware controller and there is more than one lane."""
        if len(policies) > 1 and all(isinstance(p, AutoBudget) for p in policies):
            return cls(list(policies), rows)
        return None

    # ------------------------------------------------------------------ the forward's cost

    def _modeled(self, q: int) -> float:
        prof = self.policies[0].profile
        return prof.plain_s * prof.c(q - 1)

    def forward_s(self, q: int) -> float:
        """Seconds of the target forward over q rows (all lanes' pending tokens and nodes)."""
        if self.plain is not None and q == self.plain[0]:
            return self.plain[1]
        line = self.line.fit() if self.line.sums[0] >= MIN_FIT_STEPS else None
        if line is not None:
            return line[0] + line[1] * q
        return self._modeled(q) * (self.scale or 1.0)

    def observe(self, q: int, seconds: float, drafted: bool = True) -> None:
        """A step's forward (its acceptance walks and commit included) over q rows took `seconds`; drafted: some
        lane had a tree (else it prices the all-plain step of that size)."""
        if drafted:
            self.line.observe(q, seconds)
        else:
            same = self.plain is not None and self.plain[0] == q
            self.plain = (q, 0.7 * self.plain[1] + 0.3 * seconds if same else seconds)
        ratio = seconds / self._modeled(q)
        self.scale = ratio if self.scale is None else 0.8 * self.scale + 0.2 * ratio

    # ------------------------------------------------------------------ the plan

    def budgets(self, policies: list[AutoBudget], pending: list[int], remaining: list[int],
                per_step: list[float]) -> list[Budget]:
        """Each live lane's budget. policies: the live lanes' controllers; pending: tokens each feeds before
        its tree (the bonus and forced tokens); remaining: tokens each may still commit; per_step: tokens
        each committed per step so far (1.0 before its first step). A lane planned plain may still probe."""
        lanes = self.lane_models(policies, remaining, per_step)
        if self.rows:
            best, rate, width = self.plan_rows(lanes, pending)
            q = len(lanes) * width
        else:
            best, rate = self.plan(lanes, sum(pending))
            q = sum(pending) + sum(ln.nodes[d] for ln, d in zip(lanes, best))
        slope, step_s = self._slope(q, len(lanes)), self.forward_s(q)
        used = sum(pending) + sum(ln.nodes[o] for ln, o in zip(lanes, best))  # rows that carry tokens
        out = []
        for ln, o, m in zip(lanes, best, pending):
            d, chain = ln.options[o]
            gains, nodes, draft = ln.tables[chain]
            below, above = (d, d + 1) if d < ln.top else (max(d - 1, 0), d)  # at the top: the step to it
            extra = nodes[above] - nodes[below]
            if self.rows:  # rows up to the widest lane's are free; past it, every lane's row widens
                extra = len(lanes) * max(0, m + nodes[above] - max(width, m + nodes[below]))
            marginal = slope * extra + draft[above] - draft[below]
            share = step_s * (m + nodes[d]) / used + draft[d]  # the lane's part of the step, for reports
            times = [share] * len(gains)
            # a path of this lane is worth a level if its chance, weighted, beats what the level costs
            out.append(ln.policy.choose(d, marginal, rate / max(ln.weight, 1e-3), gains, times, len(lanes), chain))
        return out

    @staticmethod
    def lane_models(policies: list[AutoBudget], remaining: list[int], per_step: list[float]) -> list["_LaneModel"]:
        steps_left = [r / max(e, 1.0) for r, e in zip(remaining, per_step)]
        last = max(steps_left) or 1.0
        return [_LaneModel(p, r, s / last) for p, r, s in zip(policies, remaining, steps_left)]

    def plan(self, lanes: list["_LaneModel"], base_q: int) -> tuple[list[int], float]:
        """(each lane's option, the objective's value there): the best of all-plain and a few Dinkelbach rounds."""
        plain = [0] * len(lanes)
        best, best_rate = plain, self.rate(lanes, plain, base_q)
        depths, lam = plain, best_rate
        for _ in range(ROUNDS):
            q = base_q + sum(ln.nodes[d] for ln, d in zip(lanes, depths))
            slope = self._slope(q, len(lanes))
            depths = [ln.best(lam, slope) for ln in lanes]
            rate = self.rate(lanes, depths, base_q)
            if rate > best_rate:
                best, best_rate = depths, rate
            if abs(rate - lam) <= 1e-6 * lam:
                break
            lam = rate
        return _with_margin(best, best_rate, plain, self.rate(lanes, plain, base_q))

    def plan_rows(self, lanes: list["_LaneModel"], pending: list[int]) -> tuple[list[int], float, int]:
        """The rows layout's plan (module notes): (each lane's option, the rate, the width)."""
        plain = [0] * len(lanes)
        best, best_rate = plain, self.rate_rows(lanes, plain, pending)
        widest = max(m + max(ln.nodes) for ln, m in zip(lanes, pending))
        for _ in range(2):  # the lanes' choices within a width depend on lam, the best rate so far
            lam = best_rate
            fits = [ln.best_within(lam, widest - m) for ln, m in zip(lanes, pending)]
            for width in range(max(pending) + 1, widest + 1):
                options = [fit[width - m] for fit, m in zip(fits, pending)]
                rate = self.rate_rows(lanes, options, pending)
                if rate > best_rate:
                    best, best_rate = options, rate
        best, best_rate = _with_margin(best, best_rate, plain, self.rate_rows(lanes, plain, pending))
        return best, best_rate, max(m + ln.nodes[o] for ln, o, m in zip(lanes, best, pending))

    def rate_rows(self, lanes: list["_LaneModel"], options: list[int], pending: list[int]) -> float:
        """The objective in the rows layout: the forward over every lane padded to the widest."""
        width = max(m + ln.nodes[o] for ln, o, m in zip(lanes, options, pending))
        seconds = self.forward_s(len(lanes) * width) + sum(ln.draft[o] for ln, o in zip(lanes, options))
        return sum(ln.weight * ln.gains[o] for ln, o in zip(lanes, options)) / seconds

    def _slope(self, q: int, lanes: int) -> float:
        """f'(q): seconds per row near q (over a lane's worth of rows: the curve is measured at coarse sizes)."""
        step = max(lanes, 4)
        return max(0.0, (self.forward_s(q + step) - self.forward_s(q)) / step)

    def rate(self, lanes: list["_LaneModel"], depths: list[int], base_q: int) -> float:
        """The objective: expected committed tokens per second of the step with these depths, each lane's
        tokens weighted by how close it is to being the batch's last."""
        q = base_q + sum(ln.nodes[d] for ln, d in zip(lanes, depths))
        seconds = self.forward_s(q) + sum(ln.draft[d] for ln, d in zip(lanes, depths))
        return sum(ln.weight * ln.gains[d] for ln, d in zip(lanes, depths)) / seconds


def _with_margin(best: list[int], best_rate: float, plain: list[int], plain_rate: float) -> tuple[list[int], float]:
    """The plan, or all-plain where the plan's gain lies inside the estimates' own error (DRAFT_MARGIN)."""
    if best_rate < (1 + DRAFT_MARGIN) * plain_rate:
        return plain, plain_rate
    return best, best_rate


class _LaneModel:
    """One lane's options, (depth, chain?) for depths 0..top in each shape its policy plans (option 0: the plain
    step), with their expected committed tokens, nodes and drafting seconds; its weight."""

    def __init__(self, policy: AutoBudget, remaining: int, weight: float):
        self.policy, self.weight = policy, weight
        self.top = max(0, min(policy.cap.max_depth, remaining - 1))  # deeper than what is left commits nothing
        policy.look()  # the lane's drafter's outlook: its pass rates for this step (suffix inside a quote)
        self.tables = {chain: policy.tables(chain) for chain in policy.shapes()}  # by depth 0..cap: a probe reads 1
        self.options = [(d, chain) for chain in self.tables for d in range(self.top + 1) if d or not chain]
        self.gains = [self.tables[chain][0][d] for d, chain in self.options]
        self.nodes = [self.tables[chain][1][d] for d, chain in self.options]
        self.draft = [self.tables[chain][2][d] for d, chain in self.options]

    def best_within(self, lam: float, most: int) -> list[int]:
        """For k = 0..most nodes at most: the option maximizing gains - lam * drafting among those of <= k nodes."""
        value = [self.weight * g - lam * c for g, c in zip(self.gains, self.draft)]
        order = sorted(range(len(self.options)), key=self.nodes.__getitem__)
        out, best, i = [], 0, 0
        for k in range(most + 1):  # one sweep over the options by node count: a running best
            while i < len(order) and self.nodes[order[i]] <= k:
                if value[order[i]] > value[best]:
                    best = order[i]
                i += 1
            out.append(best)
        return out

    def best(self, lam: float, slope: float) -> int:
        """The option maximizing gains - lam * (the forward's cost of its nodes + its drafting)."""
        return max(range(len(self.options)),
                   key=lambda o: self.weight * self.gains[o] - lam * (slope * self.nodes[o] + self.draft[o]))
