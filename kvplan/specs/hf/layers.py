"""Which layers a config.json describes: each model family's reader in turn, then the generic
attention patterns. A family reader returns None when the config is not of its family.

A reader adds named layer types (dicts in the YAML spec's form) and returns the per-layer
pattern; problems go to the Reader (one line each, naming the field), never silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvplan.specs.hf import decilm, dsv4, gemma, hybrid, mimo, minimax, mla, vision
from kvplan.specs.hf.attention import attention_pattern
from kvplan.specs.hf.reader import Reader


@dataclass(frozen=True)
class Basics:
    """The fields every decoder config has, read once."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def head(self, r: Reader) -> dict:
        """The attention layer's head fields (K/V widths may differ: v_head_dim)."""
        head = {"num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim}
        if r.has("v_head_dim"):
            head["head_dim_v"] = r.int("v_head_dim")
        return head


@dataclass
class Layers:
    layer_types: dict[str, dict] = field(default_factory=dict)
    pattern: list[str] = field(default_factory=list)
    mlp_pattern: list[str] | None = None  # per layer "dense" / "moe" / "none"; None: every layer has one
    intermediate_sizes: list[int] = field(default_factory=list)  # per layer, when the family states them


FamilyReader = Callable[[Reader, Basics, list[str]], "Layers | None"]

# most specific first; the generic attention patterns come last
FAMILIES: list[FamilyReader] = [
    hybrid.read,
    dsv4.read,
    mla.read,
    decilm.read,
    gemma.read,
    mimo.read,
    minimax.read,
    vision.read,
]


def read_layers(r: Reader, basics: Basics, notes: list[str]) -> Layers:
    types = r.list("layer_types")
    for i, t in enumerate(types or []):
        if not isinstance(t, str):  # every family compares and hashes the names
            r.bad(
                f"layer_types[{i}]",
                f'expected a layer type name such as "full_attention", got {type(t).__name__} {t!r:.40}',
            )
            return Layers(pattern=["full"], layer_types={"full": {"kind": "none"}})
    for family in FAMILIES:
        found = family(r, basics, notes)
        if found is not None:
            return found
    out = Layers()
    out.pattern = attention_pattern(r, basics.num_layers, basics.head(r), out.layer_types, notes)
    return out
