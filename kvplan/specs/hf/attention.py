"""Attention layers from a config.json: full, sliding-window (Gemma, Qwen, Mistral) and chunked
(Llama 4) patterns, and `layer_types` lists."""

from __future__ import annotations

from kvplan.specs.hf.reader import Reader


def attention_pattern(
    r: Reader, num_layers: int, head: dict, layer_types: dict, notes: list[str]
) -> list[str]:
    window = r.int("sliding_window", default=None)
    model_type = str(r.cfg.get("model_type", ""))
    full = {"kind": "full", **head}
    types = r.list("layer_types")
    if types is not None:
        if len(types) != num_layers:
            r.bad("layer_types", f"has {len(types)} entries but num_hidden_layers is {num_layers}")
            return ["full"]
        out = []
        for i, t in enumerate(types):
            if t == "full_attention":
                layer_types["full"] = full
                out.append("full")
            elif t == "sliding_attention":
                if window is None:
                    r.bad("sliding_window", f"layer_types[{i}] is sliding_attention but no window is set")
                    return ["full"]
                layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
                out.append("sliding")
            elif t == "chunked_attention":
                chunk = r.int("attention_chunk_size")
                layer_types["chunked"] = {"kind": "chunked", "chunk": chunk, **head}
                out.append("chunked")
            else:
                r.bad(
                    f"layer_types[{i}]",
                    f"layer type {t!r} is not supported from config.json; describe the model in a "
                    "YAML spec (see model_specs/models/) with a `state` or `none` layer",
                )
                return ["full"]
        return out

    if r.has("attention_chunk_size"):  # Llama 4: chunked RoPE layers, every Nth layer global NoPE
        chunk = r.int("attention_chunk_size")
        layer_types["chunked"] = {"kind": "chunked", "chunk": chunk, **head}
        layer_types["full"] = full
        no_rope = r.list("no_rope_layers")
        if no_rope is not None and len(no_rope) == num_layers:
            return ["chunked" if flag else "full" for flag in no_rope]
        interval = r.int("no_rope_layer_interval", default=4) or 4  # a bad value is in r.problems
        return ["full" if (i + 1) % interval == 0 else "chunked" for i in range(num_layers)]

    pattern_every = r.int("sliding_window_pattern", "_sliding_window_pattern", default=None)
    if window is not None and pattern_every:  # Gemma 3: N-1 local then 1 global
        layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
        layer_types["full"] = full
        return ["full" if (i + 1) % pattern_every == 0 else "sliding" for i in range(num_layers)]
    # Gemma 2, and gpt-oss without its layer_types: alternate, local first (transformers'
    # Gemma2Config.layer_types and GptOssConfig: sliding_attention where (i + 1) % 2, else full)
    if window is not None and model_type in ("gemma2", "gpt_oss"):
        layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
        layer_types["full"] = full
        return ["sliding", "full"]
    if window is not None and r.cfg.get("use_sliding_window") is not False:
        if window >= (r.int("max_position_embeddings", default=0) or 0) > 0:
            notes.append(f"sliding_window {window} >= max context: treated as full attention")
        else:
            max_window_layers = r.int("max_window_layers", default=None, minimum=0)
            layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
            if max_window_layers is not None and model_type.startswith("qwen"):
                # Qwen2: layers from max_window_layers on use the window.
                layer_types["full"] = full
                return ["full" if i < max_window_layers else "sliding" for i in range(num_layers)]
            return ["sliding"]
    layer_types["full"] = full
    return ["full"]
