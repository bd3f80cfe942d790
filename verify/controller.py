"""A cost-aware controller: before each step, the draft budget with the most expected
committed tokens per second on this machine, down to a plain step when drafting does not pay.

Model of one step with draft depth D and node budget N(D) (the drafter's tree shape:
N grows with D in the ratio of its cap, max_nodes / max_depth):

    expected committed   E(D) = 1 + delta * sum_{d=1..D} R_d,   R_d = r_1 * ... * r_d
    expected time        T(D) = t_plain * c(N(D)) + a + b * D         (T(0) = t_plain)

r_d is the drafter's measured chance to pass depth d given it reached depth d - 1 (decayed
counts, so the estimate follows the text); delta is what the steps those rates priced delivered per accepted token
they promised (`AcceptanceModel.delivery`: a text that stopped passing shows in it within a few steps, in the rates
only after many); c(n) is the verify cost curve of the target on
this machine (`CostProfile`, verify/cost_profile.py: measured once per machine + model + context bucket
and saved);
the drafting time a + b * D is fitted to the drafter's measured steps. The controller picks
D* = argmax E(D) / T(D), and a plain step unless D* beats it by DRAFT_MARGIN. Sequoia and SmartSpec
choose budgets from measured costs the same way; with a flat c(n) this is the seeds' S(alpha, K, phi)
(see `seeds_best_k`).

The profile's times are scaled by what the steps measure (one factor for the whole curve, refined per
size where steps have measured it), so a profile taken while the machine was busier or quieter than now
heals without being measured again. A decoding never measures it again mid-run: doing so when the steps
contradicted it (by a sampled tree's acceptance, or by another process starting) cost one sequence about 1.4 s
on one core, inside a user's call and inside a benchmark's timed run. It is measured when a model is first
used at a context bucket, after PROFILE_TTL_S, and when a benchmark asks (`for_model(refresh=True)`).

The plain step's time is measured, never inferred while drafting pays: the drafted steps' scale also
absorbs what only drafted steps pay (the sampled acceptance of a tree, the drafter's reads), so a plain
time derived from it would make plain decoding look slower than it is, and a drafter that never lets a
plain step run would never find out. So a policy that has not measured one gives a plain step after its
first few drafted steps, and again every PLAIN_EVERY steps while it keeps drafting (one sequence only: in
a batch a lane's share of the forward is not what a plain step of its own would cost).

A tree drafter (max_nodes > max_depth) also has a second shape to offer: its chain, one node per level (the
first child of each node: the likeliest, or under sampling the first draw, which is what a chain would draw;
the search then drafts a true chain, drafters/tree_search.py). Its pass rates are measured on the tree's own
steps (did the accepted path run through first children, `StepStats.first_accepted`) and on the chains it
drafts; its drafting time on chain steps. Which shape a step drafts is decided by what each shape's drafted
steps realized (committed tokens per second, decayed), not by the model: the model's two predictions share
its errors and sit within a few percent of each other, and chosen by them EAGLE drafted chains under greedy
decoding 3.5% slower than its tree. The other shape drafts a run of EXPLORE_RUN steps every CHAIN_EXPLORE
drafted steps, so both stay measured; the depth is the model's, within the shape. Under sampling a tree's
later siblings seldom pass (EAGLE on code at T = 0.8: the chain 13% faster than the tree), and in a batch
every node is a row of a forward that is already many rows (the batch planner offers both shapes).

When D* = 0 the drafter idles, and every `probe_every` plain steps (doubling up to 32 while probes
keep losing) it drafts one level of at most two nodes (one where a second is dear: `probe_nodes`) to re-measure, so a method that starts paying on
later text is picked up again while a silent one costs next to nothing. A probe that pays (its committed
tokens took less time than as many plain steps, by DRAFT_MARGIN) is followed by another at the next step, until one does not
(the back-off goes on where it was) or the plan drafts: it tells what the text is doing now. Backed off after
passing probes too, suffix on a real chat model's summary after three chat requests (evidence carried at a
level-1 rate of 0.15) passed two probes 16 steps apart and idled in between, through text it then drafted 16
levels deep. Over the whole chat set in category order (2 prompts each, greedy, twice) the change is level:
suffix 1.228x against 1.236x, lookahead 1.146x against 1.143x; a single prompt's figure moves more than that with
the history it follows.

A policy keeps what it learned across sequences, but a new sequence is new text: what a drafter passed on the
last requests says little about this one's (suffix on a real chat model: no draft passing on eight categories of
chat, then nearly every token of a summary quoting its passage). So at each sequence's start every level's
acceptance evidence is held to at most CARRY observations (its rate kept, the prior's share back), the probe
back-off starts over, and the first idle step probes: shared across the chat set's categories in order, suffix had
learned to idle and reached the summarization prompt at tau 1.07, where a fresh policy drafted at tau 10.7. Within a step, `Budget.min_path_prob`
tells a drafter with path confidences (EAGLE-2, standalone trees) to stop expanding paths whose draft probability is
below what one more depth costs.

A drafter that can tell before drafting how far this step's draft should pass (`outlook()`, contract.Drafter: suffix's
match length) gets pass rates per outlook (`_look`): a quote's steps are then priced by earlier quotes, not by the
chat around them, which had held the hybrid's tree shallow for six steps into a summary (docs/controller.md).
"""
from __future__ import annotations

import statistics
import time

from draftkit.verify.contract import OUTLOOK_LEVELS, Budget
from draftkit.verify.cost_profile import PROFILE_SIZES, CostProfile, context_bucket, path_of
from draftkit.verify.estimates import AcceptanceModel, DraftCost
from draftkit.verify.stats import StepStats

PROBE_WAIT_MAX = 32  # plain steps between probes at most, while probes keep losing: a probe (one level, two
# nodes) costs about a fifth of a plain step, so at one step in 17 a silent drafter paid 1.2% of plain decoding
PROBE_NODES = 2  # nodes of a probe: level 1, the best two candidates
PLAIN_FIRST = 4  # drafted steps before the first plain step is measured
PLAIN_EVERY = 64  # drafted steps in a row before the plain step is measured again (a changing machine load)
CHAIN_EXPLORE = 48  # drafted steps of the preferred shape between two runs of the other one
EXPLORE_RUN = 8  # drafted steps of the other shape in a row: a lone step of it pays for changing shapes (buffers
# of other sizes), and measured so, the other shape never won back (EAGLE on code at T = 0.8 kept its tree, 13%
# slower than its chain)
CHAIN_AFTER = 4.0  # tree steps (decayed count) whose first children were seen before the chain is offered
DRAFT_MARGIN = 0.03  # drafting must beat a plain step by 3% in the model: the best of several estimated rates is
# biased upward (each carries the noise of a few decayed observations), and a drafter that barely paid on paper
# lost 2.5-4.4% of plain sampling in practice (Medusa on prose at T = 0.8, two paired runs of eval/bench_silent.py).
# The batch planner (verify/batch_plan.py) holds its plans to the same margin over all-plain
REALIZED_KEEP = 0.95  # memory of each shape's realized rate: about 20 drafted steps
CARRY = 4.0  # observations' worth of acceptance evidence per level a new sequence starts from (module docstring)
SHAPE_BY_MODEL = 8  # a sequence's first steady drafted steps whose shape the model picks (plan())
REALIZED_CARRY = CARRY * (1 - REALIZED_KEEP)  # a new sequence keeps CARRY steps' worth of each shape's realized rate
SCALE_STEP = 2.0  # one step's measured verify time moves the curve's scale by at most this factor (observe)


# ----------------------------------------------------------------------------- controller


def _rate(plan) -> float:
    """Expected committed tokens per second at a plan's chosen depth."""
    best, _, gains, times = plan
    return gains[best] / times[best]


class AutoBudget:
    """The cost-aware budget policy (see the module docstring). One per drafter; it keeps what it
    learned about the drafter's acceptance and cost across sequences."""

    def __init__(self, model, cap: Budget, probe_every: int = 8, profile: CostProfile | None = None,
                 cache_profile: bool = True, outlook=None):
        self.model, self.cap = model, cap
        self.outlook_of = outlook  # the drafter's outlook() (contract.Drafter), or None: one set of pass rates
        self.outlook = 0  # the outlook whose pass rates `acceptance` / `chain_acceptance` are (_look)
        self._by_outlook: dict[int, tuple[AcceptanceModel, AcceptanceModel]] = {}  # the other outlooks' rates
        self.profile = profile
        self.cache_profile = cache_profile
        self.verifier = None  # the run's static verifier (price_on): its path's profile, else the eager one
        self.nodes_per_depth = cap.max_nodes / max(cap.max_depth, 1)
        self.acceptance = AcceptanceModel(max(cap.max_depth, 1))
        self.draft_cost = DraftCost()  # measured drafting seconds per step, by depth
        self.shaped = cap.max_nodes > cap.max_depth  # a tree drafter: its chain is a second shape (module docstring)
        self.chain_acceptance = AcceptanceModel(max(cap.max_depth, 1))  # the tree's first children, and chains
        self.chain_cost = DraftCost()  # drafting seconds of chain steps
        self._realized = {False: [0.0, 0.0], True: [0.0, 0.0]}  # per shape: decayed committed tokens, seconds
        self._drafted = 0  # drafted steps so far
        self._observed_at: float | None = None  # when the last step was reported (this sequence)
        self.clock = time.perf_counter  # wall time, for the shapes' realized rates (tests give a simulated one)
        self._last = {False: 0, True: 0}  # the drafted step each shape last drafted
        self._run_chain, self._run_left = False, 0  # the shape of the exploring run, and its steps left
        self._model_steps = 0  # steady drafted steps left whose shape the model picks (a new sequence's: plan())
        self.plain_s: float | None = None  # measured plain step seconds (EMA; the profile's until measured)
        self.scale: float | None = None  # measured verify time / the profile's, over every drafted step (EMA)
        self.correction: dict[int, float] = {}  # per profile size, on top of scale (EMA)
        self.probe_every, self._probe_wait, self._idle = probe_every, probe_every, 0
        self._probing = False  # the last budget given was a probe
        self._idle_plan = None  # the plan that chose depth 0, kept until the next drafted step (budget())
        self._first = False  # the next drafted step is the sequence's first
        self._drafted_run = 0  # drafted steps since the last plain step
        self._lanes = 1  # the most sequences in one forward since start(): 1 for single-sequence decoding. In a
        # batch a lane's share of a plain step is no plain step's cost, and its last steps alone still attend over
        # every lane's entries: neither measures a plain step nor judges the profile
        self._priced: bool | None = None  # the shape (chain?) whose rates priced the drafted budget given, None when
        # none was: the step's accepted tokens settle against those rates (AcceptanceModel.delivery), unchanged until
        # the step is observed
        self.choices: list[tuple[int, int]] = []  # (depth, nodes) given per step, for reports
        self.predicted: list[tuple[float, float]] = []  # (expected committed, expected seconds) per step

    def price_on(self, verifier) -> None:
        """Price this run's steps on the forward path `verifier` runs (static or compiled: the profile is measured
        on it while it is still empty; eager: the dynamic verifier's profile)."""
        self.verifier = verifier if verifier.static else None

    def start(self, prompt_len: int) -> None:
        self._lanes, self._observed_at, self._idle_plan = 1, None, None
        self._first = True  # the sequence's first drafted step is still to come: it catches up on the prompt
        for pair in [(self.acceptance, self.chain_acceptance), *self._by_outlook.values()]:  # new text (module
            for model in pair:  # docstring)
                model.carry_over(CARRY)
        self._probe_wait, self._idle = self.probe_every, self.probe_every - 1  # its first idle step probes
        self._model_steps = SHAPE_BY_MODEL if self._chain_offered() else 0
        for done in self._realized.values():  # what each shape realized, on the last text: a few steps' worth
            done[0], done[1] = done[0] * REALIZED_CARRY, done[1] * REALIZED_CARRY
        path = path_of(self.verifier)
        if self.profile is None or context_bucket(prompt_len) != self.profile.context or path != self.profile.path:
            self.profile = CostProfile.for_model(self.model, prompt_len, cache=self.cache_profile,
                                                 verifier=self.verifier, max_nodes=self.cap.max_nodes)

    def _look(self, outlook: int) -> None:
        """Make `acceptance` and `chain_acceptance` the pass rates of steps drafted with this outlook (a new one
        starts from the optimistic prior, as a new drafter does)."""
        if outlook == self.outlook:
            return
        self._by_outlook[self.outlook] = (self.acceptance, self.chain_acceptance)
        depth = max(self.cap.max_depth, 1)
        self.acceptance, self.chain_acceptance = self._by_outlook.pop(
            outlook, (AcceptanceModel(depth), AcceptanceModel(depth)))
        self.outlook, self._idle_plan = outlook, None  # an idle plan was another outlook's

    def nodes(self, depth: int, chain: bool = False) -> int:
        return depth if chain else min(self.cap.max_nodes, max(depth, round(self.nodes_per_depth * depth)))

    def _chain_offered(self) -> bool:
        return self.shaped and self.chain_acceptance.reached[0].value >= CHAIN_AFTER

    def _realized_prefers_chain(self) -> bool:
        (tc, ts), (cc, cs) = self._realized[False], self._realized[True]
        return cs > 0 and ts > 0 and cc / cs > tc / ts

    def shapes(self) -> list[bool]:
        """The shapes to plan (chain?), the preferred first: the tree alone until its first children were seen;
        then the shape whose drafted steps realized more committed tokens per second, except during a run of
        EXPLORE_RUN steps of the other one (started by `_explore`)."""
        if not self._chain_offered():
            return [False]
        chain = self._run_chain if self._run_left > 0 else self._realized_prefers_chain()
        return [chain, not chain]

    def _explore(self) -> None:
        """After a steady drafted step: start a run of the shape not preferred when it is due, every CHAIN_EXPLORE
        drafted steps (the chain's first run as soon as it is offered)."""
        if self._run_left > 0 or not self._chain_offered():
            return
        chain = self._realized_prefers_chain()
        if self._realized[True][1] == 0 or self._drafted - self._last[not chain] >= CHAIN_EXPLORE:
            self._run_chain, self._run_left = not chain, EXPLORE_RUN

    def tables(self, chain: bool = False) -> tuple[list[float], list[int], list[float]]:
        """Per depth 0..max of one shape: expected committed tokens, nodes, drafting seconds."""
        model = self.chain_acceptance if chain else self.acceptance
        reach, delivery = model.reach(), model.delivery()  # the rates' expectation, scaled by what it delivered
        depths = range(self.cap.max_depth + 1)
        cost = self.chain_cost if chain and self.chain_cost.sums[0] else self.draft_cost
        return ([1.0 + delivery * sum(reach[:d]) for d in depths], [self.nodes(d, chain) if d else 0 for d in depths],
                [cost(d) for d in depths])

    def _bucket(self, nodes: int) -> int:
        coarse = [s for s in self.profile.sizes if s in PROFILE_SIZES]  # not every size of a dense eager curve
        return min(coarse, key=lambda s: abs(s - nodes))

    def verify_time(self, nodes: int) -> float:
        """Seconds to verify `nodes` draft nodes: the profile's curve, scaled by what steps measured."""
        scale = self.scale or 1.0
        if nodes == 0:
            # a measured plain step wins; until then the profile's, scaled like the drafted steps
            return self.plain_s if self.plain_s is not None else self.profile.plain_s * scale
        return self.profile.plain_s * self.profile.c(nodes) * scale * self.correction.get(self._bucket(nodes), 1.0)

    def plan(self, chain: bool | None = None) -> tuple[int, bool, list[float], list[float]]:
        """(best depth, its shape (chain?), expected committed per depth, expected seconds per depth) for depths
        0..max: of the preferred shape (`shapes`), or of the other when the preferred one would not draft. For a
        sequence's first SHAPE_BY_MODEL steady drafted steps the model's faster shape instead (outside a run
        exploring the other shape): what each shape realized was realized on the last requests' text, and a
        tree's node count can hold its depth down where the chain's would not, so that a level the new text would
        pass is never drafted and never measured. The hybrid's tree (two nodes a level) verifies 4 nodes at depth
        2, which on one CPU BLAS cost 1.61 plain steps against 1.07 for 2: after chat requests had taught it that
        level 2 seldom passes, it drafted one level of a summary its suffix member quoted 9 levels deep alone."""
        first, *rest = self.shapes() if chain is None else [chain]
        chosen = self._plan_shape(first)
        by_model = self._model_steps > 0 and self._run_left == 0
        for shape in rest:  # planned only when it can be chosen: plan() runs before every step
            if chosen[0] and not by_model:
                break
            other = self._plan_shape(shape)
            if chosen[0] == 0 and other[0] or by_model and _rate(other) > (1 + DRAFT_MARGIN) * _rate(chosen):
                chosen = other
        return chosen

    def _plan_shape(self, chain: bool) -> tuple[int, bool, list[float], list[float]]:
        gains, nodes, draft = self.tables(chain)
        verify = [self.verify_time(n) for n in nodes]
        for d in range(1, len(verify)):  # a bigger tree never verifies faster: per-size corrections carry noise
            verify[d] = max(verify[d], verify[d - 1])
        times = [v + c for v, c in zip(verify, draft)]
        best = max(range(len(gains)), key=lambda d: gains[d] / times[d])
        if best and gains[best] / times[best] < (1 + DRAFT_MARGIN) * gains[0] / times[0]:
            best = 0  # a gain inside the estimates' own error is no gain (DRAFT_MARGIN)
        return best, chain, gains, times

    def look(self) -> None:
        """Take the drafter's outlook for the coming step (its pass rates: _look): before the step's plan, by
        `budget` for one sequence, by the batch planner for a lane."""
        if self.outlook_of is not None:
            self._look(min(max(int(self.outlook_of()), 0), OUTLOOK_LEVELS - 1))

    def budget(self, context_len: int) -> Budget:
        self.look()
        # an idle drafter's plan holds until a drafted step (a probe) changes what it knows: re-planned every
        # idle step, it cost a silent drafter about 1% of plain decoding in Python alone (suffix, prose, T = 0.8)
        plan = self._idle_plan or self.plan()
        best, chain, gains, times = plan
        self._idle_plan = plan if best == 0 else None
        if best and self._lanes == 1 and \
                self._drafted_run >= (PLAIN_FIRST if self.plain_s is None else PLAIN_EVERY):
            self._drafted_run, self._probe_wait = 0, self.probe_every
            return self._give(Budget(0, 0), gains[0], times[0])  # a plain step, to measure it (module docstring)
        # within the step: a path is worth one more depth if its chance beats the marginal cost of a level,
        # the step to the next depth (at the cap: the step to this one; an average per depth would count the
        # plain step's own cost and cut every tree down to its first level)
        below, above = (best - 1, best) if best == len(times) - 1 else (best, best + 1)
        return self.choose(best, times[above] - times[below], gains[best] / times[best], gains, times, chain=chain)

    def choose(self, depth: int, marginal_s: float, rate: float, gains: list[float], times: list[float],
               lanes: int = 1, chain: bool = False) -> Budget:
        """The budget for a chosen depth (also a batch planner's choice, verify/batch_plan.py). depth 0: idle,
        or the periodic probe; marginal_s: seconds one more level would cost; rate: committed tokens per second
        at the choice; gains / times: expected committed tokens and seconds per depth, for reports; lanes: the
        sequences of the batch (idle lanes wait up to `lanes` times longer between probes, so that a batch
        probes about as often as one sequence: at batch 8 the idle lanes' probes, each with its catch-up,
        cost DFlash 13% of plain batched decoding); chain: the tree drafter's chain shape, one node per level."""
        self._priced = None
        if depth == 0:
            self._idle += 1
            if self._idle < min(self._probe_wait, PROBE_WAIT_MAX * lanes):  # a batch's wait ends with the batch
                return self._give(Budget(0, 0), gains[0], times[0])
            # probe: one level of at most PROBE_NODES nodes, the cheapest draft that tells whether level 1 passes
            # again; deeper levels take its rate until they are tried (AcceptanceModel.rates). A probe at the
            # deepest level cost a silent drafter up to 5% of plain decoding (16 nodes every 16 steps)
            self._idle, self._probe_wait = 0, min(self._probe_wait * 2, PROBE_WAIT_MAX * lanes)
            self._probing = True
            self._priced = False
            return self._give(Budget(1, self.probe_nodes()), gains[1], times[1])
        self._probe_wait = self.probe_every
        self._priced = chain
        floor = min(0.5, max(0.0, marginal_s) * rate)
        return self._give(Budget(depth, self.nodes(depth, chain), min_path_prob=floor), gains[depth], times[depth])

    def probe_nodes(self) -> int:
        """A probe's nodes: the best two candidates of level 1, or the first alone where that is expected to
        commit more per second (level 1's first-child rate against the tree's, over the verify curve): on a CPU
        whose one-row products cost what two rows do, verifying two nodes cost SmolLM2 1.31 plain steps and one
        node 1.0, and an idle drafter's probes mostly fail. A probe is observed as a tree step either way
        (observe), so that a passing one revives the tree's rates."""
        most = min(self.nodes(1), PROBE_NODES)
        if most == 1 or not self.shaped:
            return most
        first, tree = self.chain_acceptance.rates()[0], self.acceptance.rates()[0]
        return 1 if (1 + first) / self.verify_time(1) > (1 + tree) / self.verify_time(most) else most

    def _give(self, budget: Budget, committed: float, seconds: float) -> Budget:
        """Record the budget given and what the model expects of it (for reports), and return it."""
        self.choices.append((budget.max_depth, budget.max_nodes))
        self.predicted.append((committed, seconds))
        return budget

    def observe(self, step: StepStats, context_len: int) -> None:
        now, since = self.clock(), self._observed_at
        self._observed_at = now
        if step.prefill:  # the prompt's forward says nothing about a decoding step's cost
            return
        self._lanes = max(self._lanes, step.lanes)
        probing, self._probing = self._probing, False
        if probing and self._lanes == 1 and self._paid(step):  # (a batch's steps are no single plain step)
            self._idle = self._probe_wait - 1  # the next idle step probes again (module docstring); the back-off
            # stays where it is, for when one fails
        if not step.drafted:  # a plain step measures t_plain itself
            if self._lanes == 1:  # in a batch, a lane's share of the forward (1 row of q) is no plain step's
                self._drafted_run = 0  # cost: taken as one, it made every lane's drafting look q times dearer
                self.plain_s = step.verify_s if self.plain_s is None else 0.9 * self.plain_s + 0.1 * step.verify_s
            return
        self._drafted_run += 1
        self._idle_plan = None
        # the tree drafter's chain shape (a one-node probe is the tree's first level: probe_nodes)
        chain = self.shaped and 0 < step.budget_depth == step.budget_nodes and not probing
        # a probe's drafting also catches up on every token of the idle steps before it (EAGLE runs them through
        # its draft in one forward), and a sequence's first drafted step on its whole prompt, which a drafter
        # drafting every step never pays: they bound a steady step's cost from above, so they may lower the fit
        # but not raise it. Taken as is, a probe after 16 idle steps confirmed that drafting was dear, and a hybrid
        # that had idled once idled a whole sequence; 8 EAGLE lanes, charged their prompts' catch-up (150 tokens
        # each) as their first step's drafting, priced a level at 5-7 ms a lane against about 1 ms and idled
        catching_up, self._first = probing or self._first, False
        if not catching_up:  # ... and realizes nothing a steady step would
            self._drafted += 1
            self._model_steps = max(0, self._model_steps - 1)
            self._last[chain] = self._drafted
            if self._run_left > 0 and chain == self._run_chain:
                self._run_left -= 1
            # the whole step, from the last one's report to this one's: a shape that commits fewer tokens a step
            # also pays the loop's own time per step more often (its steps' draft + verify time alone put EAGLE's
            # greedy chain level with its tree, while the chain ran 2% slower)
            seconds = now - since if since is not None else step.draft_s + step.verify_s
            done = self._realized[chain]
            done[0] = done[0] * REALIZED_KEEP + step.committed
            done[1] = done[1] * REALIZED_KEEP + seconds
        cost = self.chain_cost if chain else self.draft_cost
        if self._priced == chain:  # the rates that priced it (not yet told of this step): what they expected
            model = self.chain_acceptance if chain else self.acceptance
            model.settle(sum(model.observed_reach()[:step.depth]), step.accepted)
        self._priced = None
        if chain:
            self.chain_acceptance.observe(step.depth, step.accepted)
        else:
            self.acceptance.observe(step.depth, step.accepted)
            if self.shaped:  # what the tree's chain would have passed: the accepted path's first children
                self.chain_acceptance.observe(step.depth, step.first_accepted)
        expected = cost(step.depth)
        if not catching_up:
            cost.observe(step.depth, step.draft_s)
            self._explore()
        elif expected:  # nothing measured yet: the next steady step measures it
            cost.observe(step.depth, min(step.draft_s, expected))
        # the measured verify time rescales the whole curve, and refines it near this size. One step moves it at
        # most a factor SCALE_STEP, so that a one-off (a first forward's allocations, a page fault, another
        # process's burst) cannot set the price of every later step; a machine that really got slower or faster
        # is followed within a few steps
        known = self.scale or 1.0
        ratio = step.verify_s / (self.profile.plain_s * self.profile.c(step.drafted))
        ratio = min(max(ratio, known / SCALE_STEP), known * SCALE_STEP)
        self.scale = ratio if self.scale is None else 0.8 * self.scale + 0.2 * ratio
        bucket = self._bucket(step.drafted)
        old = self.correction.get(bucket)
        residual = ratio / self.scale
        self.correction[bucket] = residual if old is None else 0.7 * old + 0.3 * residual

    def _paid(self, step: StepStats) -> bool:
        """The step's committed tokens took less time than as many plain steps, by DRAFT_MARGIN (its drafting
        priced at the steady cost: a probe's own also catches up on the idle steps)."""
        spent = step.verify_s + self.draft_cost(step.depth)
        return step.committed * self.verify_time(0) > (1 + DRAFT_MARGIN) * spent

    def summary(self) -> dict:
        """Budgets given and what the model predicted, for reports."""
        steps = self.choices or [(0, 0)]
        committed = sum(g for g, _ in self.predicted)
        seconds = sum(t for _, t in self.predicted)
        plain = self.verify_time(0) if self.profile else None
        return {"mean_depth": statistics.mean(d for d, _ in steps), "mean_nodes": statistics.mean(n for _, n in steps),
                "plain_share": sum(d == 0 for d, _ in steps) / len(steps),
                "predicted_speedup": (committed / seconds) * plain if seconds and plain else None,
                "pass_rates": self.acceptance.rates(), "delivery": self.acceptance.delivery(),
                "verify_scale": self.scale,
                "draft_s_by_depth": [self.draft_cost(d) for d in (1, 2, 4)],
                "verify_curve": dict(zip(self.profile.sizes, self.profile.ratios)) if self.profile else None}
