"""One row of figures per (task, method) from eval/measure.py's timings.

Every figure of a row is computed over the prompts that both the method and
plain decoding finished, so a failed prompt leaves the other figures comparable.
"""
from __future__ import annotations

import statistics

from draftkit.eval.measure import Method, Result, lossless_check, median_spread, speedups
from draftkit.verify.estimates import seeds_best_k, seeds_speedup
from draftkit.verify.stats import DecodeStats


def error_row(task: str, method: str, message: str, prompt: str | None = None) -> dict:
    return {"drafter": method, "task": task, "kind": "error", "prompt": prompt, "error": message}


def _merged(res: Result, prompts) -> DecodeStats:
    stats = DecodeStats()
    for i in prompts:
        if i in res.stats_by_prompt:
            stats = stats.merge(res.stats_by_prompt[i])
    return stats


def _depth_spread(res: Result, prompts) -> list[list[float]]:
    """[d-1] = [min, max] over prompts of the share of steps reaching depth d."""
    per = [res.stats_by_prompt[i].acceptance_by_depth() for i in prompts if i in res.stats_by_prompt]
    top = max((len(a) for a in per), default=0)
    cols = [[a[d] if d < len(a) else 0.0 for a in per] for d in range(top)]
    return [[min(c), max(c)] for c in cols]


def cost_model(steps, plain_step_s: float, cost_curve) -> float | None:
    """Predicted speedup: committed tokens per step over the predicted step time in plain steps, where a
    step verifying n nodes costs c(n) (the target's measured verify curve) plus its measured drafting."""
    if not steps or cost_curve is None:
        return None
    committed = sum(s.accepted + 1 for s in steps)
    cost = sum(cost_curve(s.drafted) + s.draft_s / plain_step_s for s in steps)
    return committed / cost


def member_shares(counters: dict[str, float]) -> dict[str, float] | None:
    """A hybrid's share of accepted tokens per member (a token several members proposed is split evenly)."""
    total = sum(counters.values())
    return {k: v / total for k, v in counters.items()} if total else ({k: 0.0 for k in counters} or None)


def method_row(task: str, m: Method, res: Result, base: Result, plain_step_s: float, greedy: bool,
               cost_curve=None) -> dict | None:
    ok = [i for i in range(len(base.outputs)) if i not in res.failed and i not in base.failed]
    if not ok:
        return None  # every prompt failed: the error rows say why
    sp, lo, hi = median_spread(speedups(res, base, ok))
    st = _merged(res, ok)
    steps = st.decode_steps
    plain = m.name == "plain"
    depth = st.mean_depth
    drafting = [x for x in steps if x.drafted]
    drafted_depth = sum(x.depth for x in drafting)
    phi = sum(x.draft_s for x in drafting) / drafted_depth / plain_step_s if drafted_depth else None
    same, total = lossless_check(res, base, ok)
    budget_depth, budget_nodes = st.mean_budget
    k_star = seeds_best_k(st.alpha, phi, max_k=16) if phi is not None and not plain else None
    mem = res.memory
    return {
        "drafter": m.name, "task": task, "kind": "baseline" if plain else m.kind, "settings": m.about,
        "prompts": len(ok), "failed_prompts": len(res.failed),
        "tau": st.tau if steps else (1.0 if plain else None),
        "alpha": st.alpha if steps and not plain else None,
        "acceptance_by_depth": st.acceptance_by_depth() if steps else [],
        "acceptance_by_depth_spread": _depth_spread(res, ok) if steps else [],
        "mean_tree_size": st.mean_tree_size if steps else None,
        "tokens_per_s": statistics.median(res.tokens_per_s_over(ok)), "speedup": sp, "speedup_min": lo,
        "speedup_max": hi,
        "draft_share": st.draft_s / (st.draft_s + st.verify_s) if steps and (st.draft_s + st.verify_s) else None,
        "phi": phi,
        "predicted_speedup": None if plain else cost_model(steps, plain_step_s, cost_curve),
        "seeds_speedup": seeds_speedup(st.alpha, round(depth), phi) if phi is not None else None,
        "budget_depth": budget_depth if steps and not plain else None,
        "budget_nodes": budget_nodes if steps and not plain else None,
        "plain_step_share": sum(not x.drafted for x in steps) / len(steps) if steps and not plain else None,
        "seeds_k_star": k_star[0] if k_star else None,
        "draft_params": mem.get("param_count", 0),
        "added_bytes": {k: mem.get(k, 0) for k in ("params", "kv", "buffers")} if m.footprint or plain else None,
        # under a grammar: tau counting forced tokens (jump-forward), forced tokens, nodes pruned per step, and
        # prompts whose output max_new_tokens ended before the grammar completed
        "tau_with_forced": st.tau_with_forced if steps else None,
        "forced_tokens": st.forced_tokens, "pruned_per_step": st.pruned_nodes / len(steps) if steps else None,
        "grammar_incomplete": sum(res.stats_by_prompt[i].grammar_complete is False for i in ok
                                  if i in res.stats_by_prompt),
        "lossless": (same == total) if greedy else None,
        "identical_outputs": f"{same}/{total}" if greedy else None,
        "member_shares": member_shares(res.counters),
        # the raw timings, [repeat][prompt] (null: failed), to recompute any figure above
        "seconds": [[secs.get(i) for i in range(len(base.outputs))] for secs in res.seconds],
        "tokens": [[toks.get(i) for i in range(len(base.outputs))] for toks in res.tokens],
    }


def task_rows(task: str, methods: list[Method], results: dict[str, Result], greedy: bool,
              cost_curve=None) -> list[dict]:
    base = results["plain"]
    ok = [i for i in range(len(base.outputs)) if i not in base.failed]
    if not ok:
        return []  # plain decoding failed on every prompt: nothing to compare against
    plain_step_s = statistics.median(base.seconds[r][i] / max(base.tokens[r][i], 1)
                                     for r in range(len(base.seconds)) for i in ok if i in base.seconds[r])
    rows = [method_row(task, m, results[m.name], base, plain_step_s, greedy, cost_curve) for m in methods]
    return [r for r in rows if r is not None]
