"""Medusa: extra decoding heads on the target's last hidden state (Cai et al. 2024).

Head k (0-based) reads the target's final hidden state h_t (after the final
norm, the input of the LM head) at the position whose logits produced the root
token t + 1, and predicts the token at depth k + 1 below the root (token
t + k + 2). Each head is ResBlock (x + SiLU(Linear(x)), Linear zero-initialised)
followed by its own vocabulary projection initialised from the target's LM head
(or the target's LM head itself, frozen: `share_lm_head`).

Drafting costs no extra target forward: the verifier hands back the hidden
states of the kept positions (`hidden_layers`), the drafter keeps the last
row, and `propose` runs the heads on it. The draft is a fixed sparse tree of head
top-k choices ("medusa choices"): paths such as (0,), (1,), (0, 0) meaning
"head 0's best token, then head 1's best token below it". The choices are built
greedily from per-head top-k accuracies measured on held-out data
(`build_tree_choices`, drafters/medusa_tree.py) and saved beside the heads. Greedy proposals are
deterministic (q is None). Under sampling, each head's candidates are drawn from
q = softmax(head logits / T) without replacement (Gumbel-top-k) and rank r means
the r-th draw: the children of every slot are then the first draws of their head's
sequence, as recursive rejection sampling requires (children of different parents
at one depth share that head's sequence, which is fine: an accepted path passes
one slot per depth). Exact acceptance stays lossless either way; typical
acceptance is the verifier's business (`Sampling(acceptance="typical")`).

A saved Medusa folder (written by train/medusa.py or `save_pretrained`):
    config.json         head shapes and the target they were trained for
    model.safetensors   the heads (float16)
    tree.json           tree choices, per-head per-rank accuracies, tree size
Medusa-2 folders also hold a peft LoRA adapter for the target
(adapter_config.json, adapter_model.safetensors). Medusa-2 heads read the
*fine-tuned* target's hidden states, so load the target with
`load_target_with_adapter` (or `load_medusa`) first; greedy outputs then equal
plain greedy decoding of the fine-tuned (merged) target, not of the original.
"""
from __future__ import annotations

import json
import os
import warnings

import torch
from torch import nn

from draftkit.drafters import medusa_static
from draftkit.drafters.medusa_tree import (build_tree_choices, check_tree_choices, default_accuracies,
                                           expected_accepted, path_value)
from draftkit.drafters.tree_search import draft_probs, generator_on, gumbel_order, sampled_trees_enabled
from draftkit.verify.contract import WITHOUT_REPLACEMENT, Budget, DecodeState, DraftMismatch, DraftTree, StepResult
from draftkit.verify.lanes import lanes_forming

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TREE_NAME = "tree.json"
ADAPTER_CONFIG_NAME = "adapter_config.json"
MODEL_TYPE = "draftkit-medusa"



# ----------------------------------------------------------------------------- heads


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)); the Linear starts at zero, so the block starts as the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """`num_heads` heads of `num_layers` ResBlocks and a vocabulary projection each.

    share_lm_head: use the target's own LM head (frozen, not saved) as every head's projection;
    call `attach_lm_head(target.get_output_embeddings())` before use.
    forward(h (..., H)) -> (num_heads, ..., V) logits.
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 4, num_layers: int = 1,
                 share_lm_head: bool = False):
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.share_lm_head = num_heads, num_layers, share_lm_head
        self.blocks = nn.ModuleList(nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)])
                                    for _ in range(num_heads))
        self.proj = None if share_lm_head else nn.ModuleList(
            nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))
        self._lm_head = None  # a plain attribute holding a list: not a submodule, never saved or trained here

    def config(self) -> dict:
        return self.settings(self.hidden_size, self.vocab_size, self.num_heads, self.num_layers, self.share_lm_head)

    @staticmethod
    def settings(hidden_size: int, vocab_size: int, num_heads: int, num_layers: int, share_lm_head: bool) -> dict:
        """The config of heads of these sizes, without building them."""
        return {"hidden_size": hidden_size, "vocab_size": vocab_size, "num_heads": num_heads,
                "num_layers": num_layers, "share_lm_head": share_lm_head}

    def attach_lm_head(self, lm_head: nn.Module) -> "MedusaHeads":
        """The target's LM head, used when share_lm_head (kept out of state_dict and parameters)."""
        w = lm_head.weight
        if tuple(w.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"LM head of shape {tuple(w.shape)} does not fit heads with hidden size "
                             f"{self.hidden_size} and vocabulary {self.vocab_size}")
        self.__dict__["_lm_head"] = [lm_head]
        return self

    @torch.no_grad()
    def init_from_lm_head(self, lm_head: nn.Module) -> "MedusaHeads":
        """Copy the target's LM head into every projection (the Medusa initialisation)."""
        w = lm_head.weight
        if tuple(w.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"LM head of shape {tuple(w.shape)} does not fit heads with hidden size "
                             f"{self.hidden_size} and vocabulary {self.vocab_size}")
        if self.proj is not None:
            for p in self.proj:
                p.weight.copy_(w.to(p.weight.dtype))
        return self

    def shared_lm_head(self) -> nn.Module:
        """The target's LM head these heads project with (share_lm_head)."""
        if self._lm_head is None:
            raise RuntimeError("MedusaHeads(share_lm_head=True) needs attach_lm_head(target.get_output_embeddings())")
        return self._lm_head[0]

    def head_logits(self, k: int, h: torch.Tensor) -> torch.Tensor:
        x = self.blocks[k](h)
        if self.proj is not None:
            return self.proj[k](x)
        lm = self.shared_lm_head()
        return lm(x.to(lm.weight.dtype))

    def forward(self, h: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """(n, ..., V) logits of the first n = num_heads (default: all) heads; a shallow tree runs fewer."""
        n = num_heads or self.num_heads
        if self.proj is not None:
            return torch.stack([self.head_logits(k, h) for k in range(n)])
        # One product with the shared LM head for all n heads: (n, ..., H) @ (H, V) reads the (V, H) weight once,
        # where n separate calls would read it n times (it is the largest matrix a small target has).
        lm = self.shared_lm_head()
        return lm(torch.stack([self.blocks[k](h) for k in range(n)]).to(lm.weight.dtype))


# ----------------------------------------------------------------------------- drafter


def _target_dims(target) -> tuple[int, int, int | None, str]:
    emb = target.get_output_embeddings().weight
    cfg = getattr(target, "config", None)
    layers = getattr(cfg, "num_hidden_layers", None) if cfg is not None else None
    name = (getattr(cfg, "_name_or_path", "") if cfg is not None else "") or type(target).__name__
    return int(emb.shape[1]), int(emb.shape[0]), layers, name


class MedusaDrafter:
    """Medusa heads + a fixed tree of head top-k choices.

    target: the model being decoded (for Medusa-2: the LoRA-merged, fine-tuned target);
    heads: MedusaHeads; tree_choices: paths of top-k ranks (see `build_tree_choices`).
    sampling: the decoding's Sampling, whose top-k / top-p sampled q then gets too. Sampled draws
    come from the run's generator (DecodeState.generator: the seed given to generate).
    compile_draft: the heads compiled with static shapes (drafters/medusa_static.py), their graphs compiled when
    a sequence or a batch's lanes start.
    """

    hidden_layers: tuple[int, ...] = (-1,)  # the final hidden state (after the final norm)

    def __init__(self, target, heads: MedusaHeads, tree_choices, accuracies=None, sampling=None,
                 compile_draft: bool = False):
        hidden, vocab, _, name = _target_dims(target)
        if (heads.hidden_size, heads.vocab_size) != (hidden, vocab):
            raise ValueError(f"Medusa heads (hidden size {heads.hidden_size}, vocabulary {heads.vocab_size}) do not "
                             f"fit target {name} (hidden size {hidden}, vocabulary {vocab})")
        self.target = target
        self.heads = heads.eval()
        if heads.share_lm_head and heads._lm_head is None:
            heads.attach_lm_head(target.get_output_embeddings())
        self.accuracies = accuracies
        self.sampling = sampling
        self.compile_draft = compile_draft
        self.set_tree(tree_choices)
        self.reset(None)

    # -- tree
    def set_tree(self, tree_choices) -> None:
        """Replace the tree; paths are checked and laid out depth-first, rank 0 first."""
        choices = sorted(check_tree_choices(tree_choices, self.heads.num_heads, self.heads.vocab_size))
        self.tree_choices = choices
        self.top_k = 1 + max((max(p) for p in choices), default=-1)
        self.budget_cap = Budget(max((len(p) for p in choices), default=0), len(choices))
        # most valuable first (a parent before its children), so that a smaller budget keeps the best subtree
        acc = self.accuracies or default_accuracies(self.heads.num_heads, max(self.top_k, 1))
        self._by_value = sorted(choices, key=lambda p: (-path_value(p, acc), len(p), p))
        self._layouts: dict[tuple[int, int], tuple] = {}
        self._on_device: dict[tuple, tuple] = {}  # (layout key, device) -> (head, rank) there: uploaded once

    def set_tree_size(self, tree_size: int) -> None:
        """Rebuild the tree from the stored accuracies (or a default profile) with `tree_size` nodes."""
        acc = self.accuracies or default_accuracies(self.heads.num_heads)
        self.set_tree(build_tree_choices(acc, tree_size))

    def _layout(self, max_depth: int, max_nodes: int):
        """(head index, rank, parent) tensors of the best max_nodes choices no deeper than max_depth, and the
        head index of each node again as a host list (nothing is read per step)."""
        key = (max_depth, max_nodes)
        if key not in self._layouts:
            kept = sorted([p for p in self._by_value if len(p) <= max_depth][:max_nodes])
            index = {p: i for i, p in enumerate(kept)}
            head = torch.tensor([len(p) - 1 for p in kept], dtype=torch.long)
            rank = torch.tensor([p[-1] for p in kept], dtype=torch.long)
            parents = [index[p[:-1]] if len(p) > 1 else -1 for p in kept]
            self._layouts[key] = (head, rank, parents, [len(p) - 1 for p in kept])
        return self._layouts[key]

    # -- Drafter protocol
    def reset(self, prompt: torch.Tensor | None) -> None:
        self.hidden = None  # (H,) final hidden state at the position that produced the root
        if prompt is not None and not lanes_forming():  # a batch's lanes compile their group's graphs instead
            self.warm()

    def warm(self, rows: int = 1) -> None:
        """compile_draft: the heads' graphs for `rows` lanes now, before any step is timed."""
        if self.compile_draft:
            medusa_static.warm(self.heads, rows, *self.heads_place())

    @torch.no_grad()
    def propose(self, state: DecodeState) -> DraftTree:
        depth = self.wants(state)
        if not depth:
            return DraftTree.empty(state.tokens.device)
        return self.tree(self.head_logits(self.hidden_on_heads()[None], depth)[:, 0], state)

    def head_logits(self, hidden: torch.Tensor, n: int, rows: int | None = None) -> torch.Tensor:
        """(n, L, V): the first n heads on the lanes' hidden states (L, H), compiled when compile_draft (padded
        to the graph of `rows` lanes)."""
        return medusa_static.head_logits(self.heads, hidden, n, self.compile_draft, rows)

    def wants(self, state: DecodeState) -> int:
        """How many heads this step's tree needs (0: no tree)."""
        max_depth = min(self.heads.num_heads, state.budget.max_depth)
        if self.hidden is None or max_depth < 1 or not self.tree_choices:
            return 0
        heads = self._layout(max_depth, state.budget.max_nodes)[3]
        return 1 + max(heads) if heads else 0

    def hidden_on_heads(self) -> torch.Tensor:
        """(H,) the root's hidden state, on the heads' device and in their dtype."""
        return self.hidden.to(*self.heads_place())

    def heads_place(self) -> tuple[torch.device, torch.dtype]:
        """Where the heads run and in what dtype: their weights', or the target's LM head's when they have none
        (shared projection, no residual blocks)."""
        p = next(self.heads.parameters(), None)
        p = p if p is not None else self.target.get_output_embeddings().weight
        return p.device, p.dtype

    def tree(self, logits: torch.Tensor, state: DecodeState) -> DraftTree:
        """The step's tree from the heads' logits (at least `wants(state)` heads, (n, V))."""
        device = state.tokens.device
        head, rank, parents, head_ids = self._layout(min(self.heads.num_heads, state.budget.max_depth),
                                                     state.budget.max_nodes)
        if not state.greedy and sampled_trees_enabled():
            return self._sampled(logits, head_ids, parents, state.temperature, device,
                                 self.sampling or state.sampling, state.generator)
        top = logits.topk(self.top_k, dim=-1).indices  # (n, top_k), stays on the device
        key = (min(self.heads.num_heads, state.budget.max_depth), state.budget.max_nodes, top.device)
        if key not in self._on_device:
            self._on_device[key] = (head.to(top.device), rank.to(top.device))
        tokens = top[self._on_device[key]].to(device)
        tree = DraftTree(tokens, torch.tensor(parents))  # the topology stays on the host
        tree._parents = parents  # the topology is known on the host: validation reads nothing back
        return tree

    def lane(self) -> "MedusaDrafter":
        """A drafter for another lane of a batch: the same heads (shared, so the lanes run them together) and
        tree, a state of its own."""
        return MedusaDrafter(self.target, self.heads, self.tree_choices, self.accuracies, self.sampling,
                             self.compile_draft)

    @classmethod
    def draft_lanes(cls, drafters: list):
        """The lanes of a batch running their heads together (drafters/medusa_lanes.py), when they share them."""
        from draftkit.drafters.medusa_lanes import MedusaLanes

        return MedusaLanes(drafters) if all(d.heads is drafters[0].heads for d in drafters) else None

    def _sampled(self, logits, head_ids: list[int], parents, temperature: float, device, sampling=None,
                 gen=None) -> DraftTree:
        """The layout's tree with rank r of a slot's children = the r-th draw without replacement from
        its head's q. A slot's children are taken in rank order (the layout sorts them), so its
        j-th child is the j-th draw whatever ranks the choices name: always a prefix of the draws.
        Draws past a head's support (q = 0) stay in the tree: the verifier never accepts them, so nothing is
        read to drop them and the layout stays the one known on the host."""
        draw, seen = [], {}
        for pa in parents:
            draw.append(seen.get(pa, 0))
            seen[pa] = draw[-1] + 1
        q = draft_probs(logits, temperature, sampling)  # (num_heads, V)
        order = gumbel_order(q, min(max(draw) + 1, q.shape[-1]), generator_on(gen, q.device))  # (num_heads, k)
        # one upload, queued without a wait: each node's head and draw (a draw past the vocabulary repeats the last:
        # every token is drawn by then, its q is zero and it is never accepted)
        up = torch.tensor([head_ids, [min(d, order.shape[1] - 1) for d in draw]]).to(q.device, non_blocking=True)
        rows = up[0]
        tree = DraftTree(order[rows, up[1]].to(device), torch.tensor(parents), q=q[rows].to(device),
                         draws=WITHOUT_REPLACEMENT)
        tree._parents = list(parents)  # the topology is known on the host: validation reads nothing back
        return tree

    def update(self, result: StepResult) -> None:
        if result.hidden is None:
            raise RuntimeError("MedusaDrafter needs the target's hidden states (hidden_layers)")
        self.hidden = result.hidden[0][-1]

    # -- persistence
    def save_pretrained(self, path: str, extra_config: dict | None = None, metrics: dict | None = None) -> None:
        save_medusa(path, self.heads, self.tree_choices, self.target, accuracies=self.accuracies,
                    extra_config=extra_config, metrics=metrics)

    @classmethod
    def from_pretrained(cls, path: str, target, tree_size: int | None = None, dtype: torch.dtype | None = None,
                        check_adapter: bool = True, compile_draft: bool = False) -> "MedusaDrafter":
        """Load a saved folder for `target`. tree_size: rebuild the tree from the saved accuracies.

        dtype: heads' dtype (default: the target's, but float32 for a half-precision target on CPU).
        compile_draft: the heads compiled (see the class).
        """
        path = str(path)
        cfg_path = os.path.join(path, CONFIG_NAME)
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"{path} holds no Medusa {CONFIG_NAME}")
        with open(cfg_path) as fh:
            cfg = json.load(fh)
        if cfg.get("model_type") != MODEL_TYPE:  # vLLM's or FasterDecoding's layout (drafters/formats.py)
            from draftkit.drafters.formats import load_medusa_heads

            return cls._finish(path, target, load_medusa_heads(path, target), tree_size, dtype, compile_draft)
        hidden, vocab, layers, name = _target_dims(target)
        made_for = cfg.get("target", {})
        trained_layers = made_for.get("num_layers")
        if (cfg["hidden_size"], cfg["vocab_size"]) != (hidden, vocab) or None not in (trained_layers, layers) \
                and trained_layers != layers:
            raise DraftMismatch(
                f"Medusa heads at {path} were trained for target {made_for.get('name', '?')} (hidden size "
                f"{cfg['hidden_size']}, vocabulary {cfg['vocab_size']}, {trained_layers or '?'} layers); this target "
                f"{name} has hidden size {hidden}, vocabulary {vocab}, {layers} layers")
        if check_adapter and os.path.exists(os.path.join(path, ADAPTER_CONFIG_NAME)) \
                and getattr(target, "_draftkit_medusa_adapter", None) != os.path.abspath(path):
            warnings.warn(f"{path} holds a Medusa-2 LoRA adapter: these heads expect the fine-tuned target. "
                          "Load it with drafters.medusa.load_target_with_adapter(path, target) (or load_medusa).",
                          stacklevel=2)
        heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg["num_layers"],
                            cfg.get("share_lm_head", False))
        from safetensors.torch import load_file

        state = load_file(os.path.join(path, WEIGHTS_NAME))
        missing, unexpected = heads.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path}/{WEIGHTS_NAME} does not match its config: missing {missing}, "
                             f"unexpected {unexpected}")
        return cls._finish(path, target, heads, tree_size, dtype, compile_draft)

    @classmethod
    def _finish(cls, path: str, target, heads: MedusaHeads, tree_size, dtype, compile_draft: bool) -> "MedusaDrafter":
        """Heads to the target's device and dtype; the tree from tree.json or from (default) accuracies."""
        tdtype = next(target.parameters()).dtype
        tdev = next(target.parameters()).device
        if dtype is None:
            dtype = torch.float32 if (tdev.type == "cpu" and tdtype in (torch.float16, torch.bfloat16)) else tdtype
        heads.to(device=tdev, dtype=dtype)
        tree = {}
        tree_path = os.path.join(path, TREE_NAME)
        if os.path.exists(tree_path):
            with open(tree_path) as fh:
                tree = json.load(fh)
        accuracies = tree.get("accuracies")
        choices = tree.get("choices")
        if tree_size is not None or choices is None:
            choices = build_tree_choices(accuracies or default_accuracies(heads.num_heads),
                                         tree_size if tree_size is not None else 64)
        return cls(target, heads, choices, accuracies=accuracies, compile_draft=compile_draft)


def save_medusa(path: str, heads: MedusaHeads, tree_choices, target=None, accuracies=None,
                extra_config: dict | None = None, metrics: dict | None = None) -> None:
    """Write config.json, model.safetensors (float16) and tree.json under `path`."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    choices = check_tree_choices(tree_choices, heads.num_heads)
    cfg = {"model_type": MODEL_TYPE, **heads.config(), "hidden_layer": -1}
    if target is not None:
        hidden, vocab, layers, name = _target_dims(target)
        cfg["target"] = {"name": name, "hidden_size": hidden, "vocab_size": vocab, "num_layers": layers,
                         "model_type": getattr(getattr(target, "config", None), "model_type", None)}
    cfg.update(extra_config or {})
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in heads.state_dict().items()}
    save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
    with open(os.path.join(path, CONFIG_NAME), "w") as fh:
        json.dump(cfg, fh, indent=2)
    tree = {"tree_size": len(choices), "choices": [list(c) for c in choices]}
    if accuracies is not None:
        tree["accuracies"] = [[float(a) for a in row] for row in accuracies]
        tree["expected_accepted"] = expected_accepted(choices, accuracies)
    if metrics:
        tree["metrics"] = metrics
    with open(os.path.join(path, TREE_NAME), "w") as fh:
        json.dump(tree, fh, indent=1)


# ----------------------------------------------------------------------------- Medusa-2


def has_adapter(path: str) -> bool:
    return os.path.exists(os.path.join(str(path), ADAPTER_CONFIG_NAME))


def load_target_with_adapter(path: str, target):
    """The target with the Medusa-2 LoRA adapter in `path` merged in (a plain model again).

    Medusa-2 fine-tunes the target, so lossless / greedy-equality guarantees hold against this
    merged model, not the original. Returns `target` unchanged when `path` holds no adapter.
    """
    if not has_adapter(path):
        return target
    from peft import PeftModel

    merged = PeftModel.from_pretrained(target, str(path)).merge_and_unload()
    merged._draftkit_medusa_adapter = os.path.abspath(str(path))
    return merged.eval()


def load_medusa(path: str, target, tree_size: int | None = None):
    """(target, drafter) for a Medusa-1 or Medusa-2 folder: the target is LoRA-merged when needed."""
    target = load_target_with_adapter(path, target)
    return target, MedusaDrafter.from_pretrained(path, target, tree_size=tree_size)


__all__ = ["ResBlock", "MedusaHeads", "MedusaDrafter", "save_medusa", "load_target_with_adapter", "load_medusa",
           "has_adapter"]
