"""One verification step on the device: the step's one upload, its masks, the acceptance walk, its one read.

A step's input packs, lane by lane, each lane's pending tokens (committed, not yet in
the cache; the last one is the root) and its draft tree (verify/packed.py explains
the packing). In the rows layout (`width`, verify/forward.py) piece i takes
rows [i * width, (i + 1) * width), padded with rows that see only themselves and are never kept, so
that the step is a (pieces, width) batch whose row i is the KV buffer's row of lane i.
The host knows everything about the layout, so it sends it in ONE
upload (`sync.to_device`), a flat long tensor:

    [ ids (q) | positions (q) | lane (q) | up (q) | depth (q) | per lane: tree topology ]

up[i] is the row of node i's parent node (-1 for the pending tokens and the root's
children); depth[i] is 0 for pending tokens. Everything else is computed on the
device: the block each row sees among the new rows (pending tokens causally within
their lane, nodes their lane's pending tokens and their own ancestors), the
acceptance rule's choice per node (verify/accept.py), and the walk: the deepest
node whose ancestors were all chosen, its path and the bonus token. The walks of
all lanes come back in ONE read (`read_walks`), with argmax p of every row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from draftkit.verify import sync
from draftkit.verify.accept import choose, device_topology, topology_from, topology_ints
from draftkit.verify.contract import DraftTree

SHARED = -1  # owner of entries every lane sees (best-of-N's prompt)
PAD = -2  # padding row r of the rows layout belongs to lane PAD - r, its own: it sees only itself


@dataclass
class Piece:
    """One lane's part of a step's input: its pending tokens (host ints, or a device tensor at the prefill),
    then its draft tree."""

    owner: int  # the lane's index, or SHARED
    position: int  # position of the first pending token
    pending: list[int] | torch.Tensor
    tree: DraftTree

    @property
    def m(self) -> int:
        return len(self.pending) if isinstance(self.pending, list) else self.pending.numel()


def ancestors(up: torch.Tensor, steps: int) -> torch.Tensor:
    """(q, q) bool: [i, j] when row j is row i or one of its ancestors through `up` (-1: none), following
    at most `steps` parent links (the deepest tree's depth - 1): vector ops only, no host read."""
    idx = torch.arange(up.numel(), device=up.device)
    anc = idx[:, None] == idx[None]
    cur = up
    for _ in range(steps):
        anc |= idx[None] == cur[:, None]  # cur = -1 matches no column
        cur = torch.where(cur >= 0, up[cur.clamp_min(0)], -1)
    return anc


class StepInputs:
    """A step's input on the device (one upload), with the host's view of its layout. width: the rows layout, each
    piece padded to `width` rows (at least its own); None: the pieces back to back (packed)."""

    def __init__(self, pieces: list[Piece], device, width: int | None = None):
        self.pieces, self.width = pieces, width
        sizes = [piece.m + len(piece.tree) for piece in pieces]
        self.used = sum(sizes)  # rows that carry a lane's tokens (the rest pad the rows layout)
        self.starts = [i * width for i in range(len(pieces))] if width else [sum(sizes[:i]) for i in range(len(pieces))]
        self.q = width * len(pieces) if width else self.used
        ids, pos, lane, up, depth, topo = [], [], [], [], [], []
        bound = 0  # the deepest device-topology tree may reach (its nodes' rows are filled in below)
        for piece, start, size in zip(pieces, self.starts, sizes):
            m, tree = piece.m, piece.tree
            on_host = tree._tokens is not None  # built from host lists (a device tree is copied in below)
            ids += (piece.pending if isinstance(piece.pending, list) else [0] * m) + \
                (tree.host_tokens if on_host else [0] * len(tree))
            lane += [piece.owner] * (m + len(tree))
            pos += [piece.position + i for i in range(m)]
            up += [-1] * m
            depth += [0] * m
            if tree.topology_on_device:
                n = len(tree)
                pos, up, depth = pos + [0] * n, up + [-1] * n, depth + [0] * n
                bound = max(bound, tree.device_topology.max_depth)
                topo.append([])
            else:
                pos += [piece.position + m - 1 + d for d in tree.depth[1:]]
                up += [start + m + p if p >= 0 else -1 for p in tree.host_parents]
                depth += tree.depth[1:]
                topo.append(topology_ints(tree))
            pad = width - size if width else 0  # padding rows: token 0 at position 0, each its own lane (PAD - row)
            ids += [0] * pad
            pos += [0] * pad
            lane += [PAD - start - size - j for j in range(pad)]
            up += [-1] * pad
            depth += [0] * pad
        self.max_depth = max(max(depth, default=0), bound, 1)
        packet = sync.to_device(ids + pos + lane + up + depth + [t for ints in topo for t in ints], device)
        q = self.q
        self.ids, self.pos, self.lane, self.up, self.depth = packet[:5 * q].view(5, q)
        self.topology, offset = [], 5 * q
        for piece, start, ints in zip(pieces, self.starts, topo):
            m, tree = piece.m, piece.tree
            if not isinstance(piece.pending, list):  # already on the device (the prompt): a device copy
                self.ids[start:start + m] = piece.pending
            nodes = slice(start + m, start + m + len(tree))
            if tree._tokens is not None:
                tree.tokens = self.ids[nodes]  # drafters and the rules read the uploaded copy
            else:
                self.ids[nodes] = tree.tokens
            if tree.topology_on_device:  # its layout written on the device: no read
                t = tree.device_topology
                self.pos[nodes] = t.depth + (piece.position + m - 1)
                self.up[nodes] = torch.where(tree.parents >= 0, tree.parents + (start + m), -1)
                self.depth[nodes] = t.depth
                self.topology.append(device_topology(tree))
            else:
                self.topology.append(topology_from(tree, packet[offset:offset + len(ints)]))
            offset += len(ints)
        self._anc = None

    @property
    def anc(self) -> torch.Tensor:
        """(q, q) bool: each node's ancestors among the nodes, and every row itself."""
        if self._anc is None:
            self._anc = ancestors(self.up, self.max_depth - 1)
        return self._anc

    @property
    def block(self) -> torch.Tensor:
        """(q, q) bool: what each new row sees among the new rows."""
        idx = torch.arange(self.q, device=self.ids.device)
        pending = (self.depth == 0)[None] & (idx[None] <= idx[:, None]) & (self.lane[None] == self.lane[:, None])
        return pending | self.anc

    @property
    def branched(self) -> bool:
        return any(p.tree.topology_on_device or not p.tree.is_chain for p in self.pieces)

    def rows(self, i: int) -> tuple[int, int]:
        """(root row, first node row) of piece i."""
        start, m = self.starts[i], self.pieces[i].m
        return start + m - 1, start + m


@dataclass
class Walk:
    """One lane's accepted path on the device: count () long, path (width,) node indices (-1 padded),
    tokens (width,) their tokens, bonus () long."""

    count: torch.Tensor
    path: torch.Tensor
    tokens: torch.Tensor
    bonus: torch.Tensor


def walk(chosen: torch.Tensor, bonus: torch.Tensor, depth: torch.Tensor, anc: torch.Tensor,
         tokens: torch.Tensor, width: int) -> Walk:
    """chosen (n,) bool per node, bonus (S,) per slot, depth (n,), anc (n, n) ancestors-or-self, tokens (n,).
    The accepted path ends at the deepest node whose ancestors were all chosen (at most one per depth)."""
    n, dev = chosen.numel(), bonus.device
    if n == 0:
        none = torch.full((width + 1,), -1, device=dev)
        return Walk(none[0] + 1, none[1:], none[1:], bonus[0])
    idx = torch.arange(n, device=dev)
    on_path = chosen & ~(anc & ~chosen[None]).any(1)
    key = torch.where(on_path, depth * (n + 1) + idx, -1).max()
    found = key >= 0
    last = key.clamp_min(0) % (n + 1)
    path = torch.where(anc[last] & found, idx, n).sort().values  # ancestors come before descendants
    path = torch.nn.functional.pad(path, (0, max(0, width - n)), value=n)[:width]
    path = torch.where(path < n, path, -1)
    return Walk(torch.where(found, key.clamp_min(0) // (n + 1), 0), path, tokens[path.clamp_min(0)],
                bonus[torch.where(found, last + 1, 0)])


def walk_tree(tree: DraftTree, logits: torch.Tensor, sampling, gen, topo, anc: torch.Tensor, width: int,
              best: torch.Tensor | None = None) -> Walk:
    """The acceptance rule and the walk for one tree: logits (n + 1, V) at its root slot and nodes (best:
    their argmax, if known)."""
    chosen, bonus = choose(tree, logits, sampling, gen, topo, best)
    return walk(chosen, bonus, topo[2], anc, tree.tokens, width)


def read_walks(walks: list[Walk], extra: torch.Tensor | None = None):
    """The one read: [(accepted node indices, their tokens, bonus)] per walk, and `extra` (a long tensor) as a list."""
    width = walks[0].path.numel()
    parts = [torch.stack([w.count for w in walks]), torch.stack([w.bonus for w in walks]),
             torch.stack([w.path for w in walks]).flatten(), torch.stack([w.tokens for w in walks]).flatten()]
    host = sync.to_host(torch.cat(parts + ([extra] if extra is not None else [])))
    k = len(walks)
    out = []
    for i in range(k):
        count = host[i]
        path = host[2 * k + i * width:2 * k + i * width + count]
        tokens = host[2 * k + k * width + i * width:2 * k + k * width + i * width + count]
        out.append((path, tokens, host[k + i]))
    return out, host[2 * k + 2 * k * width:]
