"""The estimates the cost-aware controller (verify/controller.py) plans with, each learned from what steps measured:
the drafter's pass rate per depth (`AcceptanceModel`), its drafting seconds per depth (`DraftCost`, a `DecayedLine`),
and the rule that carries evidence into a new sequence (`carried`); and the seeds' closed form for a flat verify
cost, which the reports print beside them (`seeds_speedup`, `seeds_best_k`)."""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field


def seeds_speedup(alpha: float, k: int, phi: float) -> float:
    """Leviathan et al.: S = (1 - alpha^(K+1)) / ((1 - alpha)(K phi + 1)): flat verify cost."""
    if k <= 0:
        return 1.0
    gain = (k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return gain / (k * phi + 1)


def seeds_best_k(alpha: float, phi: float, max_k: int = 64) -> tuple[int, float]:
    """(K*, S(alpha, K*, phi)): the seeds' best chain length with a flat verify cost (K = 0: S = 1)."""
    best = max(range(0, max_k + 1), key=lambda k: seeds_speedup(alpha, k, phi))
    return best, seeds_speedup(alpha, best, phi)


def carried(reached: float, passed: float, most: float) -> tuple[float, float]:
    """(reached, passed) scaled down to at most `most` observations, their rate kept: what a new sequence starts
    from (verify/controller.py's module notes; the hybrid's calibration carries its cells the same way)."""
    if reached <= most:
        return reached, passed
    return most, passed * most / reached


DELIVERY_KEEPS = (0.98, 0.85)  # memories of the two delivery ratios: about 50 priced steps, and about 7 (`delivery`)
DELIVERY_PRIOR = 3.0  # accepted tokens of neutral evidence (promised = delivered) in each ratio
DELIVERY_RANGE = (0.2, 1.5)  # the ratio's bounds: a few steps' luck must not price a level at nothing or at double
DELIVERY_CARRY = 2.0  # priced steps' worth of delivery evidence a new text starts from


@dataclass
class _Decayed:
    """A count that forgets: each observation first multiplies it by `keep`."""

    value: float = 0.0

    def add(self, x: float, keep: float) -> None:
        self.value = self.value * keep + x


@dataclass
class _Delivery:
    """Accepted tokens that priced steps delivered against those their rates promised, and the steps, each a count
    decayed with `keep`."""

    keep: float
    promised: _Decayed = field(default_factory=_Decayed)
    delivered: _Decayed = field(default_factory=_Decayed)
    steps: _Decayed = field(default_factory=_Decayed)

    def add(self, promised: float, delivered: float) -> None:
        for count, x in ((self.promised, promised), (self.delivered, delivered), (self.steps, 1.0)):
            count.add(x, self.keep)

    def ratio(self) -> float:
        return (self.delivered.value + DELIVERY_PRIOR) / (self.promised.value + DELIVERY_PRIOR)

    def carry_over(self, most: float) -> None:
        share = min(1.0, most / self.steps.value) if self.steps.value else 1.0
        for count in (self.promised, self.delivered, self.steps):
            count.value *= share


def _reach(rates) -> list[float]:
    """R_d = r_1 * ... * r_d for d = 1..len(rates)."""
    return list(itertools.accumulate(rates, operator.mul))


@dataclass
class AcceptanceModel:
    """Per-depth pass rates r_d with a prior (prior_rate, prior_weight) and exponential forgetting. The prior's
    weight is forgotten like the observations (each observation of a level multiplies it by `keep`, so what is
    left of it is 1 - reached * (1 - keep)): a fixed weight of 2 against at most 1 / (1 - keep) = 33 remembered
    steps held every level-1 rate at 0.046 or more, and an n-gram drafter that passed 2-4% of the time under
    sampling kept drafting a node a step at a loss (lookahead on copy at temperature 0.8: a budget of 0.9 levels a
    step at tau 1.05, 0.92x)."""

    max_depth: int
    prior_rate: float = 0.8  # optimistic: a new drafter drafts first and learns its real rates quickly
    prior_weight: float = 2.0
    keep: float = 0.97  # about 33 steps of memory
    reached: list = field(default_factory=list)
    passed: list = field(default_factory=list)
    deliveries: tuple = field(default_factory=lambda: tuple(_Delivery(k) for k in DELIVERY_KEEPS))  # `delivery`

    def __post_init__(self):
        self.reached = [_Decayed() for _ in range(self.max_depth)]
        self.passed = [_Decayed() for _ in range(self.max_depth)]

    def observe(self, depth: int, accepted: int) -> None:
        """A step drafted to `depth` and accepted `accepted` levels: levels 1..min(depth, accepted + 1)
        were tried, levels 1..accepted passed. A step that passed every level it drafted (the budget stopped it,
        not the text) also ages the levels below it by one step's forgetting: their evidence is older text's, and
        a level the budget never reaches is never observed again. Suffix on SmolLM2's second extraction prompt
        drafted 3 levels and passed all 3 on ten steps in a row while levels 4-6 kept the 0.53 of earlier
        quotes; simulated (a chain drafter, cap 16, that curve), a long quote after quotes ending at 3 tokens ran at
        2.91x against 2.74x of plain decoding, those short quotes 2.53x against 2.46x, text passing 0.4 a level
        level (1.333x, 1.336x; 20 seeds)."""
        for d in range(min(depth, accepted + 1, self.max_depth)):
            self.reached[d].add(1.0, self.keep)
            self.passed[d].add(1.0 if d < accepted else 0.0, self.keep)
        if 0 < depth <= accepted:
            for d in range(depth, self.max_depth):
                self.reached[d].value *= self.keep
                self.passed[d].value *= self.keep

    def rates(self) -> list[float]:
        """r_d per level. The prior of level 1 is prior_rate; that of a deeper level is the rate of the level
        above it (at most prior_rate): a level seldom tried is taken to pass no more often than the one above.
        With a fixed prior, a drafter that fails at level 1 (an n-gram drafter under sampling: it is seldom
        tried deeper) kept imagined 0.8-rate levels below it, and so kept drafting at a loss."""
        prior, out = self.prior_rate, []
        for p, r in zip(self.passed, self.reached):
            w = self.prior_weight * max(0.0, 1.0 - r.value * (1.0 - self.keep))  # keep ** (observations of it)
            out.append((p.value + w * prior) / (r.value + w) if r.value + w > 0 else prior)
            prior = min(prior, out[-1])
        return out

    def carry_over(self, most: float) -> None:
        """A new text: each level's evidence scaled down to at most `most` observations, its rate kept (and so the
        prior's weight partly back, rates()); the long delivery memory to at most DELIVERY_CARRY steps (the short one
        holds a few already)."""
        for p, r in zip(self.passed, self.reached):
            r.value, p.value = carried(r.value, p.value, most)
        self.deliveries[0].carry_over(DELIVERY_CARRY)

    def observed_reach(self) -> list[float]:
        """R_d from the observations alone, without the prior (a level seen less than half an observation's worth
        takes the rate of the level above; level 1, the prior): what `settle` is given, so that `delivery` measures
        how far the observed rates missed (text that changed under them, a rate chosen for being high), not the
        prior's optimism, which is meant (a new drafter, a new text: draft first, learn quickly). Settled against
        the prior's rates too, the ratio counted that optimism once more after the rates had dropped it, and held
        a drafter of steady pass rates below its best depth (simulated: 1.3% slower at a pass rate of 0.45)."""
        rates, rate = [], self.prior_rate
        for p, r in zip(self.passed, self.reached):
            if r.value >= 0.5:
                rate = p.value / r.value
            rates.append(rate)
        return _reach(rates)

    def settle(self, promised: float, delivered: float) -> None:
        """A step these rates priced: `promised` accepted tokens were expected at the depth it drafted (the sum of
        `observed_reach` there when it was given), `delivered` were accepted."""
        for delivery in self.deliveries:
            delivery.add(promised, delivered)

    def delivery(self) -> float:
        """Accepted tokens the priced steps delivered per token their observed rates promised, the lower of two
        memories' (about 50 steps and about 7; 1 with no evidence; within DELIVERY_RANGE). The controller scales the
        rates' expected accepted tokens by it. Observed rates miss where drafting is decided: a rate is chosen for
        being high among several noisy ones, a text that stops passing lowers level 1's rate only as fast as failures
        replace 33 steps of passes, and the levels below it, no longer tried, keep promising. The long memory
        corrects a lasting miss either way; the short one sees a text that stopped passing within a few steps; the
        lower being taken, a lucky run raises the price only as far as the long memory moves. SmolLM2 on the chat
        set (1 prompt a category, 96 tokens): EAGLE-2's drafted steps accepted 0.75 tokens a step where its rates
        promised 0.88; lookahead's on retrieval QA after a summary, 0.16 against 1.22, 25 steps in a row. Simulated
        (a tree of 4 levels and 8 nodes, 6% of a plain step a node): levels passing at 0.95 for 60 steps, then at
        0.05: 19-26 of the next 80 steps drafted, against 56-65 (5 seeds); over six 96-token texts a seed (60
        seeds), quoting and silent texts in turn 1.587x against 1.550x (the worst 5% of texts 0.941x against
        0.873x), steady rates of 0.75 level (1.765x, 1.767x), steady rates of 0.45 1% slower (1.209x, 1.222x)."""
        low, high = DELIVERY_RANGE
        return min(max(min(d.ratio() for d in self.deliveries), low), high)

    def reach(self) -> list[float]:
        """R_d for d = 1..max_depth: the chance the accepted path reaches depth d."""
        return _reach(self.rates())


@dataclass
class DecayedLine:
    """y = a + b * x fitted by decayed least squares (each observation first multiplies the sums by `keep`)."""

    keep: float = 0.95
    sums: list = field(default_factory=lambda: [0.0] * 5)  # weights of 1, x, x^2, y, x*y

    def observe(self, x: float, y: float) -> None:
        terms = (1.0, x, x * x, y, x * y)
        self.sums = [s * self.keep + t for s, t in zip(self.sums, terms)]

    def fit(self) -> tuple[float, float] | None:
        """(a, b), or None while the x seen do not spread or the line would have a negative part."""
        n, sx, sxx, sy, sxy = self.sums
        spread = n * sxx - sx * sx
        if n == 0 or spread <= 1e-6 * n * n:
            return None
        b = (n * sxy - sx * sy) / spread
        a = (sy - b * sx) / n
        return (a, b) if a >= 0 and b >= 0 else None


@dataclass
class DraftCost(DecayedLine):
    """Drafting seconds per step as a + b * depth: a covers what a step pays once (catching up on committed
    tokens, the update), b each further level. With one depth seen so far the split is unknown, and half of
    the cost is taken as fixed."""

    def __call__(self, depth: int) -> float:
        n, sd, _, sy, _ = self.sums
        if depth == 0 or n == 0:
            return 0.0
        line = self.fit()
        if line is not None:
            return line[0] + line[1] * depth
        mean_d, mean_y = sd / n, sy / n
        return 0.5 * mean_y + 0.5 * mean_y * depth / max(mean_d, 1e-9)
