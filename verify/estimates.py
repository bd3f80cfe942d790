"""The estimates the cost-aware controller (verify/controller.py) plans with, each learned from what steps measured:
the drafter's pass rate per depth (`AcceptanceModel`), its drafting seconds per depth (`DraftCost`, a `DecayedLine`),
and the rule that carries evidence into a new sequence (`carried`); and the seeds' closed form for a flat verify
cost, which the reports print beside them (`seeds_speedup`, `seeds_best_k`)."""
from __future__ import annotations

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


@dataclass
class _Decayed:
    """A count that forgets: each observation first multiplies it by `keep`."""

    value: float = 0.0

    def add(self, x: float, keep: float) -> None:
        self.value = self.value * keep + x


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

    def __post_init__(self):
        self.reached = [_Decayed() for _ in range(self.max_depth)]
        self.passed = [_Decayed() for _ in range(self.max_depth)]

    def observe(self, depth: int, accepted: int) -> None:
        """A step drafted to `depth` and accepted `accepted` levels: levels 1..min(depth, accepted + 1)
        were tried, levels 1..accepted passed."""
        for d in range(min(depth, accepted + 1, self.max_depth)):
            self.reached[d].add(1.0, self.keep)
            self.passed[d].add(1.0 if d < accepted else 0.0, self.keep)

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
        prior's weight partly back, rates())."""
        for p, r in zip(self.passed, self.reached):
            r.value, p.value = carried(r.value, p.value, most)

    def reach(self) -> list[float]:
        """R_d for d = 1..max_depth: the chance the accepted path reaches depth d."""
        out, acc = [], 1.0
        for r in self.rates():
            acc *= r
            out.append(acc)
        return out


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
