"""The Triton paged decode kernel against its torch reference.

Without CUDA the kernel runs on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set
here before the kernel module is imported); with CUDA it is compiled for the GPU, and the
GPU-only cases (larger shapes, fp8) run too. Inputs are fresh random draws each run; the seed is
in every failure message. Every cache slot a sequence does not own holds NaN, so a read past a
sequence's end poisons the output.
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from kvplan.kernels.paged_decode import paged_decode, split_plan  # noqa: E402
from kvplan.kernels.reference import paged_decode_reference  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
# against the fp32 reference; bf16 output rounding alone is ~4e-3 at |x| ~ 1
TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_case(batch, q_heads, kv_heads, head_dim, page, lens, dtype, seed, v_dim=None, mla=False):
    """Random paged caches; pages shuffled; NaN in every slot no sequence owns."""
    g = torch.Generator().manual_seed(seed)
    max_pages = max(-(-n // page) for n in lens) + 2
    num_blocks = batch * max_pages + 5
    k = torch.randn(num_blocks, page, kv_heads, head_dim, generator=g)
    v = k if mla else torch.randn(num_blocks, page, kv_heads, v_dim or head_dim, generator=g)
    table = torch.randperm(num_blocks, generator=g)[: batch * max_pages].reshape(batch, max_pages)
    owned = torch.zeros(num_blocks, page, dtype=torch.bool)
    for b, n in enumerate(lens):
        for t in range(n):
            owned[table[b, t // page], t % page] = True
    k = k.clone()
    k[~owned] = float("nan")
    if mla:
        v = k
    else:
        v = v.clone()
        v[~owned] = float("nan")
    q = torch.randn(batch, q_heads, head_dim, generator=g)
    to = {"device": DEVICE}
    return (
        q.to(dtype).to(**to),
        k.to(dtype).to(**to),
        (k if mla else v).to(dtype).to(**to),
        table.to(torch.int32).to(**to),
        torch.tensor(lens, dtype=torch.int32, device=DEVICE),
    )


def ragged(batch: int, rng: random.Random, longest: int) -> list[int]:
    """Lengths including 1 and 17, the rest random and mostly not multiples of 16."""
    base = [1, 17][:batch]
    return base + [rng.randint(2, longest) for _ in range(batch - len(base))]


def check(case, dtype, seed, **kw):
    q, k, v, table, lens = case
    out = paged_decode(q, k, v, table, lens, **kw)
    ref = paged_decode_reference(
        q, k, v, table, lens, **{x: kw[x] for x in ("v_dim", "k_scale", "v_scale") if x in kw}
    )
    assert not out.isnan().any(), f"NaN in the output (seed {seed})"
    err = (out.float() - ref).abs().max().item()
    assert err <= TOL[dtype], f"max error {err:.2e} > {TOL[dtype]:.0e} (seed {seed})"
    return out


@pytest.mark.parametrize("page", [1, 16, 32])
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(32, 32), (32, 8), (64, 8), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kernel_matches_reference(page, q_heads, kv_heads, head_dim):
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32])
    lens = ragged(3, rng, 70)
    check(make_case(3, q_heads, kv_heads, head_dim, page, lens, dtype, seed), dtype, seed)


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_split_k_merge_is_exact(splits):
    # a long, ragged batch cut into several chunks must give the same answer as one chunk
    seed = random.randrange(2**31)
    case = make_case(2, 8, 2, 64, 16, [300, 129], torch.float32, seed)
    out = check(case, torch.float32, seed, num_splits=splits)
    whole = paged_decode(*case, num_splits=1)
    assert torch.allclose(out, whole, atol=1e-5), f"seed {seed}"


def test_mla_latent_576_with_512_value():
    seed = random.randrange(2**31)
    case = make_case(2, 32, 1, 576, 16, [1, 45], torch.bfloat16, seed, mla=True)
    out = check(case, torch.bfloat16, seed, v_dim=512)  # 32 query heads: two programs of 16 per KV head
    assert out.shape == (2, 32, 512)


def test_merge_loops_over_blocks_of_splits():
    # MLA merges 8 splits of 512 values at a time: 10 splits take two blocks, the second partial, and
    # the 45-token sequence leaves most of its splits empty
    seed = random.randrange(2**31)
    case = make_case(2, 16, 1, 576, 16, [300, 45], torch.float32, seed, mla=True)
    out = check(case, torch.float32, seed, v_dim=512, num_splits=10)
    assert torch.allclose(out, paged_decode(*case, v_dim=512, num_splits=1), atol=1e-5), f"seed {seed}"


@pytest.mark.parametrize("head_chunk", [16, 32])
def test_query_heads_split_across_programs(head_chunk):
    seed = random.randrange(2**31)
    case = make_case(2, 64, 2, 64, 16, [40, 17], torch.float32, seed)
    out = check(case, torch.float32, seed, head_chunk=head_chunk)
    assert torch.allclose(out, paged_decode(*case), atol=1e-5), f"seed {seed}"


@pytest.mark.parametrize("kind", ["float8_e4m3fn", "int8"])
def test_quantized_kv_with_scales(kind):
    seed = random.randrange(2**31)
    q, k, v, table, lens = make_case(2, 8, 2, 64, 16, [33, 17], torch.float32, seed)
    owned_k, owned_v = torch.nan_to_num(k), torch.nan_to_num(v)
    top = 127 if kind == "int8" else 448
    ks, vs = owned_k.abs().max().item() / top, owned_v.abs().max().item() / top
    if kind == "int8":
        kq, vq = (k / ks).round().to(torch.int8), (v / vs).round().to(torch.int8)
    else:
        kq, vq = (k / ks).to(getattr(torch, kind)), (v / vs).to(getattr(torch, kind))
    out = paged_decode(q.half(), kq, vq, table, lens, k_scale=ks, v_scale=vs)
    ref = paged_decode_reference(q.half(), kq, vq, table, lens, k_scale=ks, v_scale=vs)
    err = (out.float() - ref).abs().max().item()
    assert err <= 1e-2, f"{kind}: {err:.2e} (seed {seed})"
    # and the dequantized answer stays near full precision (quantization error, not kernel error)
    full = paged_decode_reference(q.half(), k, v, table, lens)
    assert (out.float() - full).abs().max().item() < 0.25


def test_launcher_rejects_bad_inputs():
    q, k, v, table, lens = make_case(2, 8, 2, 64, 16, [5, 9], torch.float16, 0)
    with pytest.raises(ValueError, match=r"q must be \[batch"):
        paged_decode(q[0], k, v, table, lens)
    with pytest.raises(ValueError, match="not a multiple of"):
        paged_decode(q[:, :7], k, v, table, lens)
    with pytest.raises(ValueError, match="int32"):
        paged_decode(q, k, v, table.long(), lens)
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        paged_decode(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, table, lens)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode(q[..., :32], k, v, table, lens)
    with pytest.raises(ValueError, match="needs more than"):
        paged_decode(q, k, v, table, torch.tensor([5, 10_000], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="at least one token"):
        paged_decode(q, k, v, table, torch.tensor([5, 0], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="dtype"):
        paged_decode(q.to(torch.int16), k, v, table, lens)
    with pytest.raises(ValueError, match="power of two"):
        paged_decode(q, k, v, table, lens, head_chunk=24)


def test_split_plan():
    # plenty of programs already: one split
    assert split_plan(128, 8, 8192, 64, 528) == (1, 8192)
    # batch 1, 8 KV heads, 32K context on 132 SMs x 4: 66 splits wanted; 32,768 / 66 = 497 tokens,
    # rounded up to whole 64-token tiles = 512, so 64 splits
    assert split_plan(1, 8, 32768, 64, 528) == (64, 512)
    # short sequences never split below MIN_SPLIT_TOKENS
    assert split_plan(1, 1, 300, 64, 528)[0] == 2


@gpu
@pytest.mark.parametrize("kind", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize(("batch", "longest"), [(1, 20_000), (32, 3000), (128, 600)])
def test_gpu_fp8_and_large_shapes(kind, batch, longest):
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    q, k, v, table, lens = make_case(batch, 32, 8, 128, 16, ragged(batch, rng, longest), torch.bfloat16, seed)
    kq, vq = k.to(getattr(torch, kind)), v.to(getattr(torch, kind))
    out = paged_decode(q, kq, vq, table, lens)
    ref = paged_decode_reference(q, kq, vq, table, lens)
    assert (out.float() - ref).abs().max().item() <= 2e-2, f"seed {seed}"


@gpu
@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (64, 8, 128), (8, 1, 64), (32, 32, 128)]
)
def test_gpu_bf16_tensor_core_path(q_heads, kv_heads, head_dim):
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    case = make_case(16, q_heads, kv_heads, head_dim, 16, ragged(16, rng, 5000), torch.bfloat16, seed)
    check(case, torch.bfloat16, seed)
