"""Measure the torch peak of vLLM's PyTorch-sort top-k/top-p sampler per logit, on a CUDA GPU.

kvplan charges vLLM's profiling sampler 38.5 bytes per logit on its PyTorch-sort path
(kvplan/engines/vllm_memory.py SORT_BYTES, fitted to three startup logs). This replays the same
sequence of tensor operations the dummy sampler run performs (vllm/v1/sample/sampler.py and
vllm/v1/sample/ops/topk_topp_sampler.py of 0.10-0.21: fp32 copy, temperature, sort, top-k and top-p
masks, scatter back, softmax, exponential noise, argmax) on bf16 logits that stay alive, and reads
torch.cuda.max_memory_allocated: the figure vLLM's profiler takes. It prints bytes per logit
(the bf16 logits' 2 B included) for a few (rows, vocab) shapes.

    python benchmarks/sampler_peak.py [--out FILE]     # on a CUDA GPU
    python benchmarks/sampler_peak.py --smoke          # tiny shapes on the CPU: checks the script only
"""

from __future__ import annotations

import argparse
import sys

# (rows, vocab): vLLM's sampler rows are min(max_num_seqs, max_num_batched_tokens); vocabularies of
# Llama 3 (128,256), Qwen2.5/Qwen3 (151,936) and Gemma 3 (262,208)
SHAPES = ((256, 151936), (1024, 151936), (1024, 128256), (512, 262208))


def sample_like_vllm(torch, logits, top_k: int, top_p: float):
    """The PyTorch-native path's operations in order; every intermediate lives as long as it does there."""
    x = logits.to(torch.float32)
    x.div_(0.5)  # temperature 0.5 (the dummy run's)
    s, idx = x.sort(dim=-1, descending=False)
    k = torch.full((x.shape[0],), top_k, device=x.device, dtype=torch.long)
    threshold = s.gather(1, (s.shape[1] - k).unsqueeze(1))
    s.masked_fill_(s < threshold, -float("inf"))
    cum = s.softmax(dim=-1)
    torch.cumsum(cum, dim=-1, out=cum)
    mask = cum <= 1 - top_p
    mask[:, -1] = False
    s.masked_fill_(mask, -float("inf"))
    del cum, mask
    x = s.scatter(dim=-1, index=idx, src=s)
    del s, idx
    probs = x.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script")
    args = ap.parse_args()
    import torch

    if not args.smoke and not torch.cuda.is_available():
        sys.exit("sampler_peak: no CUDA GPU (use --smoke to check the script on the CPU)")
    device = "cpu" if args.smoke else "cuda"
    shapes = ((4, 1000),) if args.smoke else SHAPES
    lines = [
        "| rows | vocab | peak above the model's state (GiB) | bytes per logit (bf16 logits included) |",
        "|---:|---:|---:|---:|",
    ]
    for rows, vocab in shapes:
        logits = torch.randn(rows, vocab, device=device, dtype=torch.bfloat16)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        out = sample_like_vllm(torch, logits, vocab - 1, 0.9)
        if device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base + logits.numel() * 2
            per = peak / (rows * vocab)
            lines.append(f"| {rows:,} | {vocab:,} | {peak / 2**30:.3f} | {per:.1f} |")
        else:
            assert out.shape == (rows,)
            lines.append(f"| {rows:,} | {vocab:,} | n/a (CPU) | n/a |")
        del logits, out
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
