"""DeepSeek-V4 attention from a config.json: `compress_ratios` per layer (0: window only,
4: CSA with the sparse indexer, 128: HCA), `sliding_window`, a single K = V latent of `head_dim`.

Sources: README, The formulas: DeepSeek-V4 (CSA / HCA); SGLang python/sglang/srt/model_executor/pool_configurator.py
(DSV4PoolConfigurator: every layer keeps the window, C4 layers `1/4` entries + the indexer, C128
layers `1/128` entries); vLLM vllm/v1/attention/backends/mla/sparse_swa.py (layer types by ratio).
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader

CSA_RATIO = 4  # the engines key the indexer on ratio 4 (SGLang num_layers_ca4, vLLM "c4a")
HCA_RATIO = 128


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    ratios = r.list("compress_ratios")
    if ratios is None:
        return None
    out = Layers()
    n = basics.num_layers or 1
    if len(ratios) < n:
        r.bad("compress_ratios", f"has {len(ratios)} entries but num_hidden_layers is {n}")
        return out
    if len(ratios) > n:
        notes.append(
            f"compress_ratios: the {len(ratios) - n} entries past num_hidden_layers (MTP) not counted"
        )
    if basics.num_kv_heads != 1:
        r.bad("num_key_value_heads", f"DeepSeek-V4 keeps one latent per token; got {basics.num_kv_heads}")
    base = {
        "kind": "compressed_mla",
        "head_dim": basics.head_dim,
        "qk_rope_head_dim": r.int("qk_rope_head_dim"),
        "window": r.int("sliding_window"),
        "q_lora_rank": r.int("q_lora_rank", default=None),
        "o_groups": r.int("o_groups", default=None),
        "o_lora_rank": r.int("o_lora_rank", default=None),
    }
    index_head_dim = r.int("index_head_dim", default=None)
    for i, ratio in enumerate(ratios[:n]):
        if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 0:
            r.bad(f"compress_ratios[{i}]", f"expected an integer >= 0, got {ratio!r}")
            return out
        ratio = 0 if ratio == 1 else ratio  # vLLM sparse_swa: ratio <= 1 is window only
        name = {0: "swa", CSA_RATIO: "csa", HCA_RATIO: "hca"}.get(ratio, f"c{ratio}")
        if name not in out.layer_types:
            layer = {**base, "ratio": ratio}
            if ratio == CSA_RATIO:
                if index_head_dim is None:
                    r.bad("index_head_dim", "required: compress ratio 4 (CSA) layers keep an indexer key")
                layer["index_head_dim"] = index_head_dim
            out.layer_types[name] = layer
        out.pattern.append(name)
    return out
