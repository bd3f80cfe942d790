"""Medusa's heads compiled (compile_draft): one graph per (heads run, rows), the rows padded to a bucket.

Eagerly a step's heads are n residual blocks and n vocabulary projections, a dozen or so kernel launches for
a few rows; on a GPU those launches, not the arithmetic, are the heads' cost. Compiled with static shapes
(verify/compiled.py: CUDA graphs on a GPU, inductor's default elsewhere), each step replays one graph. The rows
are the drafting lanes' root hidden states, padded with zeros to `bucket(rows)` (a lane that does not draft
this step costs a row of arithmetic, not a graph of its own); n, the heads the deepest tree needs, is part of
the graph (1..num_heads: a shallow tree still runs fewer heads). Every graph a group of lanes can meet is
compiled when it forms (`warm`), before any step is timed.
"""
from __future__ import annotations

import torch

from draftkit.verify.compiled import bucket, call_compiled, graph_outputs, warm_graphs

AHEAD = "drafters.medusa_static warms every graph when a sequence or a batch's lanes start"


def head_logits(heads, hidden: torch.Tensor, n: int, compile: bool, rows: int | None = None) -> torch.Tensor:
    """(n, L, V) logits of the first n heads on hidden (L, H). compile: through the graph for `bucket(rows)`
    rows (default L), a copy where CUDA-graph memory would be rewritten by the next replay."""
    if not compile:
        return heads(hidden, n)
    lanes, width = hidden.shape
    b = bucket(max(rows or lanes, lanes))
    padded = hidden if b == lanes else torch.cat([hidden, hidden.new_zeros(b - lanes, width)])
    graphs = graph_outputs(hidden.device)
    out = call_compiled(heads, key(n, b, hidden.dtype), f"Medusa's heads ({n} of {heads.num_heads}) for {b} "
                        f"row{'s' if b > 1 else ''}", AHEAD, graphs, h=padded, num_heads=n)
    out = out[:, :lanes]
    return out.clone() if graphs else out


def key(n: int, b: int, dtype: torch.dtype) -> tuple:
    return ("medusa", n, b, dtype)


@torch.no_grad()
def warm(heads, rows: int, device: torch.device, dtype: torch.dtype) -> None:
    """Compile, before any step is timed, the graph of every head count for `rows` lanes; said in one line,
    nothing when every graph exists (they are kept on the heads, so later sequences reuse them)."""
    b = bucket(rows)
    hidden = torch.zeros(b, heads.hidden_size, device=device, dtype=dtype)
    calls = [(key(n, b, dtype), lambda n=n: head_logits(heads, hidden, n, True)) for n in range(1, heads.num_heads + 1)]
    warm_graphs(heads, calls, f"Medusa's heads (1-{heads.num_heads} of them) for {b} row{'s' if b > 1 else ''}")
