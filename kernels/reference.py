"""Plain torch reference for paged decode attention: gather each sequence's K/V through its
block table, then attention in float32. The Triton kernel is tested against this."""

from __future__ import annotations

import torch


def gather(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[num_blocks, page, heads, dim] cache -> [seq_len, heads, dim] for one sequence's pages."""
    page = cache.shape[1]
    pages = -(-seq_len // page)
    return cache[block_table[:pages].long()].reshape(pages * page, *cache.shape[2:])[:seq_len]


def paged_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    v_dim: int | None = None,
) -> torch.Tensor:
    """q [batch, q_heads, d]; caches [num_blocks, page, kv_heads, d(_v)]; returns [batch, q_heads, d_v]
    in float32. `v_dim` takes the first v_dim values of each V vector (MLA: V is the latent's first 512)."""
    batch, q_heads, d = q.shape
    kv_heads = k_cache.shape[2]
    group = q_heads // kv_heads
    dv = v_dim or v_cache.shape[-1]
    scale = d**-0.5 if scale is None else scale
    out = torch.empty(batch, q_heads, dv, dtype=torch.float32, device=q.device)
    for b in range(batch):
        n = int(seq_lens[b])
        k = gather(k_cache, block_table[b], n).float() * k_scale  # [n, kv_heads, d]
        v = gather(v_cache, block_table[b], n)[..., :dv].float() * v_scale
        k = k.repeat_interleave(group, dim=1)  # one K/V head serves `group` query heads
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out
