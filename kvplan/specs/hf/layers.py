"""Which layers a config.json describes: each model family's reader in turn, then the generic
attention patterns. A family reader returns None when the config is not of its family.

A reader adds named layer types (dicts in the YAML spec's form) and returns the per-layer
pattern; problems go to the Reader (one line each, naming the field), never silently.
"""

from __future__ import annotations

from collections.abc import Callable

from kvplan.specs.hf import decilm, dsv4, gemma, hybrid, mimo, minimax, mla, vision
from kvplan.specs.hf.attention import attention_pattern
from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader

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
    found = _read_layers(r, basics, notes)
    types = r.cfg.get("layer_types")
    if types is not None and "layer_types" not in r.read:  # the family's reader lays out its own layers
        odd = sorted({str(t) for t in types} - _PLAIN) if isinstance(types, list) else [repr(types)[:40]]
        if odd:
            notes.append(
                f"WARNING: {r.prefix}layer_types names {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''} but model_type "
                f"{r.cfg.get('model_type')!r} lays out its layers from its own fields; planned from those"
            )
    return found


_PLAIN = {"full_attention", "attention"}  # what every layer of an attention-only family is


def _read_layers(r: Reader, basics: Basics, notes: list[str]) -> Layers:
    types = r.cfg.get("layer_types")
    for i, t in enumerate(types if isinstance(types, list) else []):
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
