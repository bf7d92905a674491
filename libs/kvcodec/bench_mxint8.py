"""Prints MXINT8 sizes, encode/decode throughput and error on a KV-cache-shaped bf16 tensor.

Default shape: SmolLM2-135M's KV for 2048 tokens, [layers=30, k/v=2, tokens, kv_heads=3,
head_dim=64]. The data is synthetic but KV-like: Gaussian values with log-normal per-channel
magnitudes, and keys with a few outlier channels (as RoPE'd keys have), which is what makes
per-32-value scales matter. Throughput counts the bf16 bytes on the uncompressed side.

    ./bazel run //libs/kvcodec:bench_mxint8 -- --tokens 512 --repeats 3
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from libs.kvcodec.mxint8 import BLOCK_SIZE, decode, encode, from_bytes, to_bytes


def kv_like(layers: int, tokens: int, kv_heads: int, head_dim: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    channel_scale = torch.exp(0.75 * torch.randn(layers, 2, 1, kv_heads, head_dim, generator=gen))
    outliers = torch.randint(0, head_dim, (layers, kv_heads, 2), generator=gen)
    keys_scale = channel_scale[:, 0]
    for layer in range(layers):  # a handful of outlier key channels per head; setup only
        for head in range(kv_heads):
            keys_scale[layer, 0, head, outliers[layer, head]] *= 12.0
    kv = torch.randn(layers, 2, tokens, kv_heads, head_dim, generator=gen) * channel_scale
    return kv.to(torch.bfloat16)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocator, thread pool
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    kv = kv_like(args.layers, args.tokens, args.kv_heads, args.head_dim, args.seed)
    bf16_bytes = kv.numel() * kv.element_size()
    mx = encode(kv)
    blob = to_bytes(mx)
    restored = decode(from_bytes(blob))
    assert torch.equal(restored, decode(mx))  # a broken byte format would make the numbers meaningless

    print(f"shape {tuple(kv.shape)} bf16, {kv.numel():,} values, torch threads {torch.get_num_threads()}")
    print(f"bytes bf16      {bf16_bytes:,}")
    print(f"bytes mxint8    {len(blob):,} (payload {mx.nbytes:,} + header {len(blob) - mx.nbytes})")
    print(
        f"ratio           {len(blob) / bf16_bytes:.6f} (payload {mx.nbytes / bf16_bytes:.6f}, ideal 33/64 = {33 / 64})"
    )

    timings = {
        "encode": best_seconds(lambda: encode(kv), args.repeats),
        "decode": best_seconds(lambda: decode(mx), args.repeats),
        "to_bytes": best_seconds(lambda: to_bytes(mx), args.repeats),
        "from_bytes": best_seconds(lambda: from_bytes(blob), args.repeats),
    }
    for name, seconds in timings.items():
        print(f"{name:<15} {seconds * 1e3:8.2f} ms  {bf16_bytes / seconds / 1e9:6.2f} GB/s of bf16")

    # Errors in fp32: the difference of two bf16 values in the same block is exact there.
    x = kv.float()
    err = (restored.float() - x).abs()
    block_max = x.abs().reshape(-1, BLOCK_SIZE).amax(dim=-1, keepdim=True)
    per_block = (err.reshape(-1, BLOCK_SIZE) / block_max.clamp_min(torch.finfo(torch.float32).tiny)).amax()
    nonzero = x != 0
    print(f"max abs error   {err.max().item():.6g}")
    print(f"mean abs error  {err.mean().item():.6g}")
    print(f"max |err| / block max |x|     {per_block.item():.6g} (bound 1/128 = {1 / 128:.6g})")
    print(f"mean |err| / |x| (x != 0)     {(err[nonzero] / x.abs()[nonzero]).mean().item():.6g}")
    print(f"median |err| / |x| (x != 0)   {(err[nonzero] / x.abs()[nonzero]).median().item():.6g}")
    print(f"relative RMS ||err|| / ||x||  {(err.norm() / x.norm()).item():.6g}")


if __name__ == "__main__":
    main()
