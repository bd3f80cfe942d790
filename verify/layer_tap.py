"""The hidden states a drafter reads, and only those: forward hooks instead of `output_hidden_states=True`.

transformers' `output_hidden_states=True` returns every layer's hidden state at every step and at the prefill: for an
8B model (32 layers, hidden 4096) and a 4k-token prompt about 2 GB in fp32 and 1 GB in bf16, where an EAGLE-3 draft
reads three layers. A LayerTap hooks the modules whose outputs ARE those hidden states (transformers' numbering:
0 the embeddings' output, k in 1..L-1 decoder layer k-1's output, L the final norm's output) and keeps only the
layers asked for. Whether a model's modules line up with its `hidden_states` is checked once per model by one small
forward both ways (GPT-2's hidden_states[0] adds position embeddings to the token embeddings, so it fails there);
a model that does not match, or whose modules cannot be found, keeps `output_hidden_states=True`.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


def _modules(model) -> list | None:
    """[embeddings, layer 0, ..., layer L-1, final norm] of a decoder-only model, or None."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    if base is None:
        return None
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    norm = getattr(base, "norm", None) or getattr(base, "ln_f", None) or getattr(base, "final_layernorm", None)
    embed = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    if layers is None or norm is None or embed is None:
        return None
    return [embed, *layers[:-1], norm]  # module k's output is hidden_states[k]


class LayerTap:
    """Forward hooks that record hidden_states[k] for the k asked for (see the module docstring)."""

    def __init__(self, modules: list):
        self.modules = modules  # index k: the module whose output is hidden_states[k]

    @classmethod
    def of(cls, model) -> "LayerTap | None":
        """The model's tap (checked once, kept on the model), or None: use output_hidden_states."""
        if "_draftkit_tap" in model.__dict__:
            return model.__dict__["_draftkit_tap"]
        modules = _modules(model)
        tap = cls(modules) if modules else None
        if tap is not None and not tap._matches(model):
            tap = None
        model.__dict__["_draftkit_tap"] = tap
        return tap

    @torch.no_grad()
    def _matches(self, model) -> bool:
        ids = torch.arange(1, 5, device=model.device)[None] % model.config.get_text_config().vocab_size
        every = tuple(range(len(self.modules)))
        with self.capture(every) as got:
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        ref = out.hidden_states
        return len(ref) == len(self.modules) and all(
            got.get(k) is not None and got[k].shape == ref[k].shape and torch.equal(got[k], ref[k]) for k in every)

    @contextmanager
    def capture(self, layers):
        """Within the block, forwards record {k: (B, T, H)} for each k in `layers` (negative: from the end)."""
        got: dict[int, torch.Tensor] = {}
        n = len(self.modules)
        handles = []
        for k in sorted({k % n for k in layers}):
            def hook(_module, _inputs, output, k=k):
                got[k] = output[0] if isinstance(output, tuple) else output
            handles.append(self.modules[k].register_forward_hook(hook))
        try:
            yield got
        finally:
            for h in handles:
                h.remove()
