"""What each family reader is given (Basics: the fields every decoder config has) and what it
returns (Layers: named layer types and the per-layer pattern). layers.py runs the readers in turn."""

from __future__ import annotations

from dataclasses import dataclass, field

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
