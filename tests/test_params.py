def test_qwen3_vl_vision_tower_params_follow_vllm_qwen3_vl_py():
    """Qwen3-VL-30B-A3B's tower (vllm/model_executor/models/qwen3_vl.py): h 1152, inter 4304, depth 27,
    patch 16, temporal 2, 3 channels, merge 2, out 2048, 3 deepstack mergers, 2304 positions."""
    import json
    from pathlib import Path

    from kvplan.specs.hf import model_from_config
    from kvplan.specs.matrices import vision_matrices

    path = Path(__file__).parent / "fixtures/hf/corpus/qwen3-vl-30b-a3b-instruct.json"
    spec = model_from_config(json.loads(path.read_text()), path)
    assert spec.vision_tower is not None
    h, inter, merged, out = 1152, 4304, 1152 * 4, 2048
    patch_embed = 3 * 2 * 16 * 16 * h + h  # Conv3d with bias
    pos_embed = 2304 * h
    block = (
        4 * h + (3 * h * h + 3 * h) + (h * h + h) + (2 * h * inter + inter + h)
    )  # 2 LayerNorms, qkv, proj, MLP
    merger = 2 * h + merged * merged + merged + merged * out + out  # LayerNorm(h) before the merge
    deepstack = 2 * merged + merged * merged + merged + merged * out + out  # LayerNorm(4h) after it
    expected = patch_embed + pos_embed + 27 * block + merger + 3 * deepstack
    assert expected == 538_631_408
    assert sum(m.params for m in vision_matrices(spec.vision_tower)) == expected
