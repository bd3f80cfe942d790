"""EAGLE: a feature-level draft model over the target's own hidden states (Li et al. 2024).

The draft runs on pairs. Pair t is (f_t, x_{t+1}): the target's feature at
position t and the embedding of the token that followed it, mixed by
fc([emb(x_{t+1}); f_t]) (Linear 2H -> H) and sent through ONE decoder layer of
the target's architecture (with its own final norm), at rotary position t. Its
output f^_{t+1} predicts the target's feature at position t + 1; the target's
frozen LM head turns it into a distribution over x_{t+2}. The embedding table
and the LM head are the target's: referenced, never saved with the draft.

Features. EAGLE-1/2: f_t = the target's last hidden state (transformers'
hidden_states[-1], the final-norm output, so lm_head(f) are the target's
logits). EAGLE-3: f_t = Linear(nH -> H) over the concatenation of several
hidden states (feature_layers, e.g. a low, a middle and the last one).

Decoding. After every verification the draft cache holds one pair per
committed position but the root: the last one is (f_last, root) and its output
f^_root gives the root's children. Tree nodes go in as (f^_parent, emb(node))
at position root + depth - 1 through drafters.tree_search (EAGLE-2 dynamic
tree, or a chain, sampled with q in sampling mode). On update the nodes'
entries are dropped, accepted ones included: they are recomputed from the TRUE
target features of the kept positions (as EAGLE does) in the next step's first
draft forward, which also yields the root's children: no separate update pass,
and nothing at all while the budget keeps the drafter idle.

Saved folder: config.json (sizes, feature_layers, target name and the
architecture of the draft layer) + model.safetensors (fp16; loaded as fp32).

This is draftkit's own layout ("draftkit"). The reference-exact EAGLE-1/2 and
EAGLE-3 drafts that vLLM and SGLang compute are layout "reference"
(drafters/eagle_reference.py); both plug into EagleDrafter, which asks the draft
for `logits(features, target_head)`. Folders in the public formats load through
drafters/formats.py.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import torch
from torch import nn
from transformers import AutoConfig, AutoModel

from draftkit.drafters.draft_dtype import draft_dtype as dtype_for, head_in, reads_of
from draftkit.verify.contract import Budget, DecodeState, DraftMismatch, DraftTree, StepResult
from draftkit.verify.lanes import lanes_forming


CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def _text_config(target):
    cfg = target.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _target_name(target) -> str:
    return str(getattr(target.config, "_name_or_path", "") or getattr(target, "name_or_path", "") or "")


def target_shape(target) -> tuple[int, int, int]:
    """(hidden size, vocabulary size, decoder layers) of a causal LM."""
    cfg = _text_config(target)
    vocab = target.get_output_embeddings().weight.shape[0]
    return int(cfg.hidden_size), int(vocab), int(cfg.num_hidden_layers)


def normalize_layers(feature_layers: Sequence[int] | None, num_layers: int) -> list[int]:
    """Indices into the hidden-states tuple (0 = embeddings, num_layers = final-norm output);
    negative ones count from the end. None or [] means [num_layers] (EAGLE-1/2)."""
    n_states = num_layers + 1
    layers = list(feature_layers) if feature_layers else [num_layers]
    out = []
    for i in layers:
        j = int(i) + n_states if int(i) < 0 else int(i)
        if not 0 <= j < n_states:
            raise ValueError(f"feature layer {i} is out of range for a target with {num_layers} layers "
                             f"({n_states} hidden states: 0 = embeddings .. {num_layers} = last)")
        out.append(j)
    if len(set(out)) != len(out):
        raise ValueError(f"feature_layers repeat a layer: {layers} -> {out}")
    return out


def check_target_shape(config, target, method: str, script: str) -> None:
    """A one-line ValueError naming both when `config` (hidden_size, vocab_size, num_target_layers,
    target_name) was made for a target of another shape than `target`."""
    c = config
    hidden, vocab, layers = target_shape(target)
    if (hidden, vocab, layers) != (c.hidden_size, c.vocab_size, c.num_target_layers):
        made = c.target_name or "an unnamed target"
        name = _target_name(target) or type(target).__name__
        raise DraftMismatch(
            f"{method} draft mismatch: the draft was made for {made} (hidden size {c.hidden_size}, vocabulary "
            f"{c.vocab_size}, {c.num_target_layers} layers) but the target {name} has hidden size {hidden}, "
            f"vocabulary {vocab}, {layers} layers; train a draft for this target with {script}")


@contextmanager
def naming_config(path: str):
    """A draft built from a folder's config.json: its one-line errors (the config's check, the layer checks, a
    field the config does not know or lacks) name that file."""
    try:
        yield
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}/{CONFIG_NAME}: {e}") from None


@dataclass
class EagleConfig:
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    feature_layers: list[int]
    target_name: str = ""
    layer_config: dict = field(default_factory=dict)  # the target's config: architecture of the draft layer
    kind: str = "eagle"
    layout: str = "draftkit"  # "draftkit" (this module) or "reference" (drafters/eagle_reference.py)
    draft_vocab_size: int = 0  # reference layout: size of a reduced draft vocabulary (0: the target's)
    fc_bias: bool = False  # reference EAGLE-1: fc with a bias (SafeAILab's original checkpoints)
    norm_before_residual: bool = False  # reference EAGLE-3: residual taken after hidden_norm (speculators)
    mask_token_id: int | None = None  # reference EAGLE-3 with parallel drafting (P-EAGLE, drafters/peagle.py)
    # greedy EAGLE-2 trees score paths by log softmax(logits / tree_temperature): fitted on the target's own text
    # (train/calibrate.py) so that a node's score estimates the chance the target keeps it; drafts trained on the
    # target's soft labels are under-confident (the shipped ones: mean top-1 probability 0.30, top-1 right 0.91)
    tree_temperature: float = 1.0
    # decoding with a cache: keys more than this many positions back are hidden (0: none), so that the draft's
    # attention meets only the relative distances it was trained on (train/eagle.py sets it to seq_len);
    # beyond them the shipped 4-layer P-EAGLE committed 2.11 tokens a step instead of 2.97 (code, 350-token prompts)
    attention_window: int = 0

    @classmethod
    def from_target(cls, target, feature_layers: Sequence[int] | None = None) -> "EagleConfig":
        hidden, vocab, layers = target_shape(target)
        layer_config = _text_config(target).to_dict()
        for key in ("id2label", "label2id", "architectures", "transformers_version", "_name_or_path"):
            layer_config.pop(key, None)
        return cls(hidden, vocab, layers, normalize_layers(feature_layers, layers), _target_name(target),
                   layer_config)

    @property
    def eagle3(self) -> bool:
        return len(self.feature_layers) > 1

    def check(self) -> "EagleConfig":
        """The config itself, or a one-line error naming the bad field (a hand-edited config.json)."""
        n = self.num_target_layers
        if not self.feature_layers or not all(0 <= k <= n for k in self.feature_layers):
            raise ValueError(f"EAGLE feature_layers must be hidden_states indices in 0..{n}, got {self.feature_layers}")
        if not self.tree_temperature > 0:
            raise ValueError(f"tree_temperature must be > 0, got {self.tree_temperature}")
        if self.attention_window < 0:
            raise ValueError(f"attention_window must be >= 0 (0: none), got {self.attention_window}")
        if self.attention_window and self.layout != "reference":  # only the reference drafts apply it
            raise ValueError(f"attention_window applies to reference-layout drafts; this one is {self.layout!r}")
        if self.draft_vocab_size < 0 or self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in 0..{self.vocab_size} (0: the target's), "
                             f"got {self.draft_vocab_size}")
        return self


def _build_layer(layer_config: dict) -> nn.Module:
    """A one-layer base model (decoder layer, rotary embedding, final norm) of the target's architecture,
    without its token embedding: it takes inputs_embeds, a KV cache, 4D masks and position ids."""
    conf = dict(layer_config)
    model_type = conf.pop("model_type")
    if isinstance(conf.get("layer_types"), list):
        conf["layer_types"] = conf["layer_types"][:1]
    if isinstance(conf.get("per_layer_config"), dict):  # Gemma 4: {"layer index": overrides}; layer 0's stays
        conf["per_layer_config"] = {k: v for k, v in conf["per_layer_config"].items() if str(k) == "0"}
    conf.update(num_hidden_layers=1, use_cache=True)
    cfg = AutoConfig.for_model(model_type, **conf)
    base = AutoModel.from_config(cfg, dtype=torch.float32)
    if not hasattr(base, "layers"):
        raise ValueError(f"EAGLE needs a decoder-only architecture with a .layers list; {type(base).__name__} has none")
    base.set_input_embeddings(None)  # the target's embedding table is used instead
    return base


class EagleDraftModel(nn.Module):
    """fc([emb(x_{t+1}); f_t]) -> one decoder layer -> final norm: predicts f_{t+1} (hidden size H)."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config.check()
        h, n = config.hidden_size, len(config.feature_layers)
        self.fuse = nn.Linear(n * h, h, bias=False) if n > 1 else None  # EAGLE-3 low/mid/high fusion
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.body = _build_layer(config.layer_config)

    @classmethod
    def from_target(cls, target, feature_layers: Sequence[int] | None = None,
                    init_from_target: bool = False) -> "EagleDraftModel":
        """A fresh draft for `target`, its decoder layer of the target's own architecture where a one-layer model
        of it runs on embeddings alone; else (GPT-2-style bodies without a `.layers` list: GPT-J, Falcon, StarCoder 1;
        Gemma 4, whose layers read per-layer token embeddings) a Llama layer of the target's width, as every
        reference EAGLE draft is. Its final norm starts as the target's; with init_from_target the decoder layer
        starts as a copy of the target's last layer (own architecture only)."""
        config = EagleConfig.from_target(target, feature_layers)
        draft = cls._if_it_runs(config)
        if draft is None:
            from draftkit.drafters.reference_config import llama_layer_config  # it imports this module

            return cls(replace(config, layer_config=llama_layer_config(target))).float()
        base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        with torch.no_grad():
            norm = getattr(base, "norm", None)
            if norm is not None and hasattr(draft.body, "norm"):
                draft.body.norm.load_state_dict(norm.state_dict())
            if init_from_target:
                draft.body.layers[0].load_state_dict(base.layers[-1].state_dict())
        return draft.float()

    @classmethod
    def _if_it_runs(cls, config: EagleConfig) -> "EagleDraftModel | None":
        """A draft of config whose one-layer body runs on embeddings alone, or None (from_target)."""
        try:
            draft = cls(config)
            with torch.no_grad():
                draft.body(inputs_embeds=torch.zeros(1, 2, config.hidden_size))
        except (AttributeError, TypeError, ValueError, RuntimeError, KeyError):
            return None
        return draft

    # --- features -------------------------------------------------------------------------------
    def select(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """The draft's input features from a hidden-states tuple: (..., H) or (..., nH) for EAGLE-3."""
        if len(hidden) != self.config.num_target_layers + 1:
            raise ValueError(f"expected {self.config.num_target_layers + 1} hidden states (embeddings + "
                             f"{self.config.num_target_layers} layers), got {len(hidden)}")
        feats = [hidden[i] for i in self.config.feature_layers]
        return feats[0] if len(feats) == 1 else torch.cat(feats, -1)

    def join(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        """The draft's input features from the feature layers alone (in feature_layers order)."""
        return layers[0] if len(layers) == 1 else torch.cat(list(layers), -1)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, cache=None, attention_mask=None,
                position_ids=None, use_cache: bool = True) -> torch.Tensor:
        """features (B, T, H) (the draft's own outputs, or EAGLE-1/2 target features) or (B, T, nH)
        (raw EAGLE-3 target features, fused here); embeds (B, T, H) of the next tokens.
        Returns (B, T, H): the predicted next features."""
        features = features.to(self.fc.weight.dtype)
        if self.fuse is not None and features.shape[-1] != self.config.hidden_size:
            features = self.fuse(features)
        x = self.fc(torch.cat([embeds.to(features.dtype), features], -1))
        out = self.body(inputs_embeds=x, cache=cache, use_cache=cache is not None,
                        attention_mask=attention_mask, position_ids=position_ids)
        return out.last_hidden_state

    def logits(self, features: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """Target-vocabulary logits of the draft's outputs (here: the target's LM head over them)."""
        return head(features.to(head.weight.dtype))

    @property
    def cache_config(self):
        return self.body.config

    # --- compatibility and files ----------------------------------------------------------------
    def check_target(self, target) -> None:
        """Raise ValueError when this draft was made for a target of another shape."""
        check_target_shape(self.config, target, "EAGLE", "train/eagle.py")

    def save_pretrained(self, path: str, dtype: torch.dtype = torch.float16) -> None:
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt", "kind": "eagle"})
        with open(os.path.join(path, CONFIG_NAME), "w") as fh:
            json.dump(asdict(self.config), fh, indent=2)

    @classmethod
    def from_pretrained(cls, path: str, target=None) -> "EagleDraftModel":
        """A draftkit-layout folder; any other layout or format (reference layout, SafeAILab, SpecForge,
        speculators, engine exports) goes through drafters.formats (`target` fills what they omit)."""
        from safetensors.torch import load_file

        cfg_path = os.path.join(path, CONFIG_NAME)
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"{path} holds no EAGLE draft ({CONFIG_NAME} missing)")
        with open(cfg_path) as fh:
            raw = json.load(fh)
        if raw.get("kind") != "eagle" or raw.get("layout", "draftkit") != "draftkit":
            from draftkit.drafters.formats import load_eagle_draft

            return load_eagle_draft(path, target)
        with naming_config(path):
            draft = cls(EagleConfig(**raw))
        state = {k: v.float() for k, v in load_file(os.path.join(path, WEIGHTS_NAME)).items()}
        missing, unexpected = draft.load_state_dict(state, strict=False)
        missing = [k for k in missing if "rotary" not in k and "inv_freq" not in k]
        if missing or unexpected:
            raise ValueError(f"{path}: weights do not match the draft config (missing {missing}, "
                             f"unexpected {unexpected})")
        return draft.float()


class EagleDrafter:
    """EAGLE-2 dynamic tree (or a chain) from an EAGLE draft model over the target's features.

    max_depth: draft depth; max_nodes: tree size cap; top_k: children expanded per frontier node
    (1: a single chain, sampled from q in sampling mode). The budget each step may be smaller.
    temperature: the draft's q temperature when sampling (default: the sampling temperature).
    Under sampling a tree's children are drawn from q without replacement (tree_search.sampled_search);
    `sampling`: the decoding's Sampling, whose top-k / top-p q then gets too.
    """

    def __init__(self, target, draft: EagleDraftModel, max_depth: int = 5, max_nodes: int = 48, top_k: int = 8,
                 temperature: float | None = None, sampling=None, draft_dtype: str = "auto",
                 compile_draft: bool = False):
        if max_depth < 1:
            raise ValueError(f"draft depth max_depth must be >= 1, got {max_depth}")
        if top_k < 1 or max_nodes < 1:
            raise ValueError(f"top_k and max_nodes must be >= 1, got {top_k} and {max_nodes}")
        if temperature is not None and temperature <= 0:
            raise ValueError(f"the draft temperature must be > 0, got {temperature}")
        draft.check_target(target)
        self.target = target
        self.embed = target.get_input_embeddings()
        self.draft_dtype = draft_dtype
        self.compile_draft = compile_draft  # static-shape draft forwards, compiled (verify/tree.py run_model)
        own_head = isinstance(getattr(draft, "lm_head", None), nn.Module)  # EAGLE-3's; EAGLE-1/2 read the target's
        dtype = dtype_for(target, draft_dtype, reads_of(draft, target, not own_head))  # drafters/draft_dtype.py
        # the target's LM head, in the draft's dtype when the draft reads it (EAGLE-3 drafts have their own)
        self.head = target.get_output_embeddings() if own_head else head_in(target, dtype)
        self.device = self.head.weight.device
        self.draft = draft.to(self.device, dtype).eval()
        self.dtype = dtype
        self.hidden_layers = tuple(draft.config.feature_layers)
        self.top_k = min(top_k, draft.config.draft_vocab_size or draft.config.vocab_size)
        self.budget_cap = Budget(max_depth, max_nodes if top_k > 1 else max_depth)
        self.temperature = temperature
        self.sampling = sampling
        self.tree_temperature = float(draft.config.tree_temperature)
        self.cache = None
        self.alone = self.lanes_class()([self])  # one sequence drafts as a group of one (drafters/lanes.py)
        self.reset(None)

    @staticmethod
    def lanes_class():
        """The group its lanes draft in (drafters/eagle_lanes.py)."""
        from draftkit.drafters.eagle_lanes import EagleLanes

        return EagleLanes

    @classmethod
    def from_pretrained(cls, path: str, target, **flags) -> "EagleDrafter":
        """draftkit folders of either layout and the public formats (drafters/formats.py)."""
        from draftkit.drafters.formats import load_eagle_draft

        return cls(target, load_eagle_draft(path, target), **flags)

    def lane(self) -> "EagleDrafter":
        """A drafter for another lane of a batch: the same draft (its weights shared, so the lanes can draft
        together) and settings, a state of its own."""
        cap = self.budget_cap
        return type(self)(self.target, self.draft, max_depth=cap.max_depth, max_nodes=cap.max_nodes,
                          top_k=self.top_k, temperature=self.temperature, sampling=self.sampling,
                          draft_dtype=self.draft_dtype, compile_draft=self.compile_draft)

    @classmethod
    def draft_lanes(cls, drafters: list):
        """The lanes of a batch drafting together (drafters/eagle_lanes.py), when they share a draft and settings."""
        group = cls.lanes_class()
        return group(drafters) if group.compatible(drafters) else None

    def reset(self, prompt) -> None:
        # out of any batch's group; the cache holds committed pairs (committed tokens - 1)
        self.alone.reset(2 * (prompt.numel() if prompt is not None else 0) + 256,
                         warm=prompt is not None and not lanes_forming())
        self.bank = None  # row 0: f^ at the root; row e + 1: output of the e-th node run this step
        self.todo = []  # (features (k, nH), next tokens (k,)) of kept positions the draft has not run yet

    def warm(self) -> None:
        self.alone.warm_alone()  # verify/lanes.py forming_lanes

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary logits (reference EAGLE-3: the draft's own head, -inf outside its vocabulary)."""
        return self.draft.logits(feats, self.head)

    def propose(self, state: DecodeState) -> DraftTree:
        return self.alone.propose([state])[0]

    @torch.no_grad()
    def update(self, result: StepResult) -> None:
        if result.hidden is None:
            raise ValueError("EagleDrafter needs the target's hidden states (hidden_layers)")
        # node entries were computed from draft features: drop them all, accepted ones included; their
        # true target features enter the next step's first draft forward together with the bonus
        self.cache.drop_pending()
        fed = result.fed_tokens.to(self.device)
        bonus = len(result.new_tokens) - 1 - result.forced  # grammar-forced tokens follow it, not yet fed
        nxt = torch.cat([fed[1:], result.new_tokens[bonus:bonus + 1].to(self.device)])  # x_{t+1} per kept position t
        self.todo.append((self.draft.join(result.hidden), nxt))
