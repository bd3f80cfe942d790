"""A hybrid drafter: several drafters propose, their trees become one tree, and the target decides.

No single method wins everywhere: suffix and lookahead win where the text repeats, the model-based
drafters where it does not and under sampling, and which one is right changes within one request.
The hybrid asks its members (any drafters of the registry) for trees each step and merges them
(drafters/tree_merge.py): shared prefixes become one path, so a token proposed by two members is
verified once, and the merged tree is cut to the step's budget by each node's estimated chance of
acceptance. That chance is calibrated per member, per depth and per sibling rank from what the
verifier kept (`Calibration`): a member that stops being right stops getting nodes.

Each step:
1. ask: each member that pays is asked for a tree within the step's budget (and its own cap). Under
   greedy decoding every member may fill the whole node budget and the merged tree is cut to it by
   score; under sampling each member gets a share of the nodes, fixed before it drafts, node by node to
   the member whose next node adds the most calibrated expected accepted tokens, so that no member's draws
   are dropped because of another member's draws (that would bias the sample; see tree_merge.py).
2. merge and cut: see tree_merge.py. Nodes whose calibrated chance of being reached is below `min_chance` are
   not verified; the rest are cut to the budget's node count, the likeliest kept. The step's own floor
   (Budget.min_path_prob, the controller's price of one more level) is the members' to apply, each with its own
   node scores (suffix's path probabilities; EAGLE's depth is the controller's choice), not the merge's: cut
   again by the coarse per-member, per-depth chances it took the depth the controller had chosen back off the
   tree. Greedy on SmolLM2's chat set (2 prompts a category, 96 tokens, interleaved, idle) the floor cut kept a
   depth-2 budget to one level whenever EAGLE-3's calibrated depth-2 reach (about 0.42 x 0.3) fell under a
   floor of 0.14, and the hybrid ran at 1.00x on STEM and 0.96x on humanities beside EAGLE-3 alone's 1.33x /
   1.08x; without it 1.31x / 1.12x, and at least the floor cut's speed on all seven categories tried (extraction
   1.93x against 1.78x, coding 1.27x against 1.16x); on the shipped family's code, prose and JSON likewise (2.39-
   3.04x against 2.37-2.82x), copy level. Under sampling the same: a fixed floor of 0.05 cut EAGLE's deep and
   sibling draws that still passed (a suffix + EAGLE hybrid at temperature 0.8 committed 2.79 tokens a step on
   code against EAGLE alone's 3.07, 3.23 with the floor at 0.005), and the step's floor left the hybrid 0.14-0.22
   tokens a step behind EAGLE alone on copy and prose.
3. update: the calibration learns, per member, which of its draws were accepted at the slots the
   walk reached; accepted tokens are credited to the members that proposed them (split evenly when
   several did: `member_accepted`, which compare.py reports as shares). Every member is then told
   the step as usual: the committed tokens, the target's hidden states of the layers it asked for
   (hidden_layers of the hybrid is the union of its members'), and its own tree with its accepted
   prefix and its rows of logits when the whole of its tree was verified. A member that was not
   asked, or whose tree lost nodes to the cut, is told the step as if it had proposed nothing: the
   target computed no logits for the nodes it lost, and a member that reads them (lookahead's
   Jacobi branch) must not be handed invented ones.

Skipping members. A member pays when the tokens credited to it per step it was asked beat what
its drafting time would have produced at the hybrid's measured rate (tokens per second), and when
its best possible node (depth 1, rank 0) clears the floor; under a fixed budget, where measured timings must not
change the tree (one seed reproduces a sample), when it is credited FIXED_MIN_VALUE tokens per step it was asked
and its best node clears the floor. A member that does not pay is not even
asked (its drafting cost is saved) and is probed again after `probe_every` steps, the wait
doubling up to 16 steps while probes keep losing, and at the first step of every new sequence (new text: suffix
skipped on chat prompts pays on a summary that quotes its passage); a probe keeps the member's draws whatever their
chance, so that its calibration is measured again.

Sampling stays exact: every member's tree is exact on its own (deterministic, i.i.d. or without
replacement), members draw independently of each other, the verifier tests each slot's draws
member by member (multi-step speculative sampling across members, each member's own rule within
it, contract.SiblingDraws), and a node proposed by several members is tested once per draw (with
each draw's q), so a duplicate costs no forward row and biases nothing.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from draftkit.drafters.tree_merge import MergedTree, merge_trees, tried_before
from draftkit.verify.contract import Budget, DecodeState, DraftTree, StepResult
from draftkit.verify.controller import CARRY
from draftkit.verify.estimates import carried

RANKS = 4  # sibling ranks calibrated apart; later ranks share the last one's rate
PROBE_WAIT_MAX = 16
MIN_ASKED = 4  # asked steps before a member's value and cost are trusted
FIXED_MIN_VALUE = 0.05  # under a fixed budget: accepted tokens credited per asked step below which a member is skipped


@dataclass
class Calibration:
    """Per member m, depth d and sibling rank r: the chance that a draw of m at (d, r) is accepted once
    the walk reached its parent, from decayed counts with a prior of weight `weight`: `prior` / (1 + r), except
    that a first-ranked draw below depth 1 takes the chance of the first-ranked draw above it (as the controller's
    deeper levels take the last tried level's rate). With a flat prior at every depth the deep levels stranded:
    suffix on SmolLM2's summaries passed 0.82 at depth 3, depths 6-12, never drafted, kept the prior 0.5, their
    path scores fell under the step's floor, and the hybrid drafted at tau 1.5 beside suffix alone at 3.9.
    The chance never rises with rank, so the draws a floor keeps at a slot are a prefix of a member's; it depends
    on past steps only, so it stays exact under sampling (tree_merge.py)."""

    members: int
    depth: int
    prior: float = 0.5
    weight: float = 2.0
    keep: float = 0.97  # about 33 observations of memory per cell
    reached: list = field(default_factory=list)
    passed: list = field(default_factory=list)

    def __post_init__(self):
        shape = lambda: [[[0.0] * RANKS for _ in range(self.depth)] for _ in range(self.members)]  # noqa: E731
        self.reached, self.passed = shape(), shape()
        self._chances: dict[int, list[list[float]]] = {}  # per member, [depth][rank], until the next observation

    def observe(self, m: int, d: int, r: int, accepted: bool) -> None:
        d, r = min(d, self.depth) - 1, min(r, RANKS - 1)
        self.reached[m][d][r] = self.reached[m][d][r] * self.keep + 1.0
        self.passed[m][d][r] = self.passed[m][d][r] * self.keep + float(accepted)
        self._chances.pop(m, None)

    def carry_over(self, most: float) -> None:
        """A new text: each cell's evidence scaled down to at most `most` observations, its rate kept (the prior's
        share partly back), as the controller carries its estimates into a new sequence (verify/controller.py)."""
        for member_reached, member_passed in zip(self.reached, self.passed):
            for rd, pd in zip(member_reached, member_passed):  # one depth: a count per rank
                for k in range(RANKS):
                    rd[k], pd[k] = carried(rd[k], pd[k], most)
        self._chances.clear()

    def chance(self, m: int, d: int, r: int) -> float:
        d, r = min(d, self.depth) - 1, min(r, RANKS - 1)
        if m not in self._chances:
            self._chances[m] = self._member_chances(m)
        return min(self._chances[m][d][: r + 1])

    def _member_chances(self, m: int) -> list[list[float]]:
        """Member m's chances, [depth][rank]: decayed counts over the prior, depth by depth."""
        out, w, above = [], self.weight, self.prior
        for reached, passed in zip(self.reached[m], self.passed[m]):
            prior = [above] + [self.prior / (1 + k) for k in range(1, RANKS)]
            out.append([(passed[k] + w * prior[k]) / (reached[k] + w) for k in range(RANKS)])
            above = out[-1][0]
        return out


@dataclass
class Member:
    name: str
    drafter: object
    layers: tuple[int, ...] = ()  # positions of its hidden_layers in the hybrid's
    skipping: bool = False
    wait: int = 8  # steps between probes while skipping
    idle: int = 0
    asked: int = 0  # steps it was asked (for MIN_ASKED)
    value: float = 0.0  # decayed accepted tokens credited per asked step
    cost_s: float = 0.0  # decayed drafting seconds (propose + update) per asked step
    propose_s: float = 0.0  # this step's proposing seconds
    probe: bool = False  # this step is a probe


class HybridDrafter:
    """Proposals of several drafters merged into one tree (see the module notes).

    members: (name, drafter) pairs, two or more; at every slot the member likeliest to pass there is tested
    first (drafters/tree_merge.py), ties in this order.
    max_depth, max_nodes: the largest merged tree (its `budget_cap`); each member also keeps its own cap.
    min_chance: nodes whose estimated chance of being reached is below it are not verified, in [0, 1).
    probe_every: steps a member that does not pay waits before it is asked again (doubling up to 16).
    skip: False asks every member every step, paying or not (experiments, tests of the merged trees).
    """

    def __init__(self, members, max_depth: int = 12, max_nodes: int = 24, min_chance: float = 0.01,
                 probe_every: int = 8, skip: bool = True):
        members = list(members)
        if len(members) < 2:
            raise ValueError(f"a hybrid needs two or more members, got {len(members)}")
        if max_depth < 1 or max_nodes < 1:
            raise ValueError(f"max_depth and max_nodes must be >= 1, got {max_depth} and {max_nodes}")
        if not 0.0 <= min_chance < 1.0:
            raise ValueError(f"min_chance must be in [0, 1), got {min_chance}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        self.budget_cap = Budget(max_depth, max_nodes)
        self.min_chance, self.probe_every, self.skip = float(min_chance), probe_every, skip
        layers: list[int] = []
        for _, d in members:
            layers += [x for x in getattr(d, "hidden_layers", ()) if x not in layers]
        self.hidden_layers = tuple(layers)
        self.members = [Member(name, d, tuple(layers.index(x) for x in getattr(d, "hidden_layers", ())),
                               wait=probe_every) for name, d in members]
        self.calibration = Calibration(len(self.members), max_depth)
        self.member_accepted = {m.name: 0.0 for m in self.members}  # accepted tokens credited, all time
        self._rate = [0.0, 0.0]  # decayed committed tokens, decayed seconds between steps
        self._last_step: float | None = None

    # --- state -----------------------------------------------------------------------------
    def reset(self, prompt) -> None:
        self.calibration.carry_over(CARRY)  # new text: what the last requests taught weighs a few observations
        for m in self.members:
            m.drafter.reset(prompt)
            if m.skipping:  # a new text: a member skipped on the last ones is probed at once, its back-off over
                m.wait, m.idle = self.probe_every, self.probe_every  # (suffix: idle on chat, then a summary)
        self._last_step = None  # the first step of a sequence says nothing about the rate

    def warm(self) -> None:
        """Its members compile what they draft with (verify/lanes.py forming_lanes: a batch's hybrids form no group)."""
        for m in self.members:
            if hasattr(m.drafter, "warm"):
                m.drafter.warm()

    def forget(self) -> None:
        """Members that remember past requests (suffix) forget them (a benchmark's new repeat). What the hybrid
        learned about its members (the calibration: how often each one's draws pass) stays, carried into each new
        sequence as a few observations' worth (`reset`), as the controller's estimates are: started over at every
        prompt of eval/compare.py's default run, the hybrid committed 9-10% fewer tokens a step (greedy, fixed
        budget, 80 tokens a prompt). A fresh hybrid starts from the prior."""
        for m in self.members:
            if hasattr(m.drafter, "forget"):
                m.drafter.forget()

    # --- proposing ---------------------------------------------------------------------------
    def outlook(self) -> int:
        """The highest of its members' outlooks (contract.Drafter.outlook; 0 when none has one): a member that
        can tell its draft will pass far (suffix inside a quote) lifts the merged tree's."""
        return max((int(m.drafter.outlook()) for m in self.members if hasattr(m.drafter, "outlook")), default=0)

    def _asked(self, floor: float) -> list[Member]:
        """Members asked this step: those that pay, and those whose probe is due; when none is, every
        skipping member is probed (the budget asks for a draft: the controller is probing the hybrid)."""
        for m in self.members:
            m.probe = False
        if not self.skip:
            return list(self.members)
        out = []
        for i, m in enumerate(self.members):
            if m.skipping:
                if m.idle < m.wait:
                    continue
                m.probe = True
            elif self.calibration.chance(i, 1, 0) < floor:
                self._skip(m)  # its best node would be cut anyway: do not pay for drafting it
                continue
            out.append(m)
        if not out:
            out = [m for m in self.members if m.skipping]
            for m in out:
                m.probe = True
        return out

    def _shares(self, asked: list[Member], budget: Budget, greedy: bool) -> dict[str, int]:
        """Nodes each asked member may propose, at most its `_room`. Greedy: its whole room (the merged tree is cut
        by score). Sampling: shares fixed before drafting, node by node to the member whose next node adds the most
        expected accepted tokens (`_node_values`); a member on probe gets one node first. Shares in proportion to
        the members' gains gave a member accepted 4% of the time a node of every step, taken from the chain of
        one accepted 70% of the time (suffix beside EAGLE on code at T = 0.8). A member's nodes count only when the
        members tried before it at the root (tree_merge.py's order) failed there: valued as if alone, suffix's
        first node (calibrated 0.6-0.7 after a run of matches) outbid EAGLE's second level, and a chain step of two
        levels became two level-1 siblings, one of each member. Every node is handed out, however little it is
        worth: stopping at the step's floor kept EAGLE's deeper levels from ever being drafted, so their calibration
        stayed at its prior (0.5 a level, under the floor), and the sampled hybrid fell to depth 1 (tau 1.84 on
        code against EAGLE alone's 3.17)."""
        room = {m.name: self._room(m, budget) for m in asked}
        if greedy:
            return {m.name: room[m.name][1] for m in asked}
        out = {m.name: min(int(m.probe), room[m.name][1]) for m in asked}
        value, missed = {}, 1.0  # missed: the chance that the members tried before m at the root all failed there
        index = {m.name: self.members.index(m) for m in asked}
        for m in sorted(asked, key=lambda m: tried_before(self.calibration.chance, index[m.name], 1)):
            value[m.name] = [v * missed for v in self._node_values(m, room[m.name][1], room[m.name][0])]
            missed *= 1.0 - self.calibration.chance(index[m.name], 1, 0)
        for _ in range(budget.max_nodes - sum(out.values())):
            open_ = [m for m in asked if out[m.name] < len(value[m.name])]
            if not open_:
                break
            best = max(open_, key=lambda m: value[m.name][out[m.name]])  # the value of its next node
            out[best.name] += 1
        return out

    @staticmethod
    def _room(m: Member, budget: Budget) -> tuple[int, int]:
        """(depth, nodes) member m may draft this step: the step's budget within its own cap; when the step's budget
        is a chain (the controller's chain shape, one node per level), a chain of its own. Given the chain step's
        nodes past its depth (EAGLE: a depth cap of 4 in a chain step of 8), EAGLE drafted a sampled tree of
        siblings that seldom pass instead of its chain, and the sampled hybrid ran 10% fewer tokens a step."""
        cap = getattr(m.drafter, "budget_cap", None) or budget
        depth = min(budget.max_depth, cap.max_depth)
        nodes = min(budget.max_nodes, cap.max_nodes)
        return depth, (min(nodes, depth) if budget.max_nodes <= budget.max_depth else nodes)

    def _node_values(self, m: Member, n: int, depth: int) -> list[float]:
        """Expected accepted tokens that each of member m's first n nodes adds: the chance its first-ranked chain
        reaches level k (k <= depth); past the depth, a further sibling at level 1 (tried when the first-ranked
        draw failed)."""
        i, cal, out, reach = self.members.index(m), self.calibration, [], 1.0
        for k in range(1, n + 1):
            if k <= depth:
                reach *= cal.chance(i, k, 0)
                out.append(reach)
            else:
                out.append((1.0 - cal.chance(i, 1, 0)) * cal.chance(i, 1, k - depth))
        return out

    def propose(self, state: DecodeState) -> DraftTree:
        budget = state.budget
        floor = max(self.min_chance, budget.min_path_prob)  # the controller's floor prices a node's verify cost
        asked = self._asked(floor)
        shares = self._shares(asked, budget, state.greedy)
        trees: list[DraftTree | None] = [None] * len(self.members)
        for i, m in enumerate(self.members):
            if m not in asked or shares[m.name] < 1:
                if m in asked and self.skip:  # its nodes are worth less than the others': skipped, probed later
                    self._skip(m)
                m.probe = False
                continue
            mine = Budget(self._room(m, budget)[0], shares[m.name], budget.min_path_prob, budget.fixed)
            t0 = time.perf_counter()
            tree = m.drafter.propose(dataclasses.replace(state, budget=mine)).validate()
            m.propose_s = time.perf_counter() - t0
            if len(tree) > mine.max_nodes or tree.max_depth > mine.max_depth or tree.sibling_draws is not None:
                tree = DraftTree.empty(state.tokens.device).validate()  # a member that ignored its budget
            trees[i] = tree
        keep_all = {i for i, m in enumerate(self.members) if m.probe}
        merged = merge_trees(trees, self.calibration.chance, self.min_chance, budget.max_nodes, keep_all,
                             state.tokens.device)  # module notes, step 2: the floor is the members' to apply
        merged.extra.fixed_budget = budget.fixed  # read back in update(), with the step's result
        return merged

    # --- learning ----------------------------------------------------------------------------
    def _calibrate(self, info: MergedTree, accepted: list[int]) -> dict[int, float]:
        """Observe every draw at the slots the walk reached; credit each accepted node to its proposers."""
        credit: dict[int, float] = {}
        for k in range(len(accepted) + 1):
            slot = 0 if k == 0 else accepted[k - 1] + 1
            taken = accepted[k] if k < len(accepted) else None
            for draw, node in info.slot_draws[slot]:
                self.calibration.observe(draw.member, draw.depth, draw.rank, node == taken)
        for a in accepted:
            who = {d.member for d in info.draws[a]}
            for m in who:
                credit[m] = credit.get(m, 0.0) + 1.0 / len(who)
        return credit

    def _member_result(self, i: int, m: Member, result: StepResult, info: MergedTree | None) -> StepResult:
        hidden = None if not m.layers or result.hidden is None else tuple(result.hidden[j] for j in m.layers)
        if info is not None and info.whole(i) and len(info.trees[i]):
            tree = info.trees[i]
            rows = torch.tensor([0] + [w + 1 for w in info.where[i]], device=result.logits.device)
            return StepResult(result.new_tokens, result.fed_tokens, hidden, result.logits.index_select(0, rows),
                              tree, info.member_path(i, result.accepted), forced=result.forced)
        empty = DraftTree.empty(result.new_tokens.device).validate()
        return StepResult(result.new_tokens, result.fed_tokens, hidden, result.logits[:1], empty, [],
                          forced=result.forced)

    def update(self, result: StepResult) -> None:
        info = result.tree.extra if isinstance(result.tree.extra, MergedTree) else None
        credit = self._calibrate(info, result.accepted) if info is not None else {}
        for i, m in enumerate(self.members):
            m.idle += m.skipping  # steps waited for the next probe
            t0 = time.perf_counter()
            m.drafter.update(self._member_result(i, m, result, info))
            if info is not None and info.trees[i] is not None:
                self._judge(i, m, credit.get(i, 0.0), m.propose_s + time.perf_counter() - t0, not info.fixed_budget)
        for i, c in credit.items():
            self.member_accepted[self.members[i].name] += c
        self._measure_rate(result.new_tokens.numel())

    def _measure_rate(self, committed: int) -> None:
        now = time.perf_counter()
        if self._last_step is not None:
            self._rate = [0.9 * self._rate[0] + committed, 0.9 * self._rate[1] + now - self._last_step]
        self._last_step = now

    def _judge(self, i: int, m: Member, credited: float, seconds: float, timed: bool) -> None:
        """After a step m was asked: does it pay? Its best node must clear the floor, and the tokens
        credited to it must beat what its drafting time would have produced at the hybrid's rate (`timed`; under
        a fixed budget a floor on the credited tokens instead)."""
        m.asked += 1
        keep = 0.8
        m.value = credited if m.asked == 1 else keep * m.value + (1 - keep) * credited
        m.cost_s = seconds if m.asked == 1 else keep * m.cost_s + (1 - keep) * seconds
        rate = self._rate[0] / self._rate[1] if self._rate[1] > 0 else 0.0
        # under a fixed budget measured timings must not change the tree (one seed reproduces a sample): there a
        # member pays while it is credited FIXED_MIN_VALUE tokens per asked step
        worth = m.asked < MIN_ASKED or (m.value >= m.cost_s * rate if timed else m.value >= FIXED_MIN_VALUE)
        pays = worth and self.calibration.chance(i, 1, 0) >= self.min_chance
        if m.probe:
            m.probe = False
            if pays:
                m.skipping, m.wait = False, self.probe_every
            else:
                m.idle, m.wait = 0, min(2 * m.wait, PROBE_WAIT_MAX)
        elif not pays:
            self._skip(m)

    def _skip(self, m: Member) -> None:
        m.skipping, m.idle = True, 0

    def summary(self) -> dict:
        """Accepted tokens credited to each member and whether it is skipped now, for reports."""
        return {m.name: {"accepted": self.member_accepted[m.name], "skipping": m.skipping} for m in self.members}
