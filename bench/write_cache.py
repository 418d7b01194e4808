"""write_cache on the GPU: its kernel (core/write.cuh) beside the torch ops of the contract
(storage.write), in one process, on the same cache, slots and values (GPU).

    python3 bench/write_cache.py [SPEC ...] [--tokens 128,4096] [--iters 50]

For each spec and token count: GPU time of one call (CUDA-graph replay, median; L2 flushed
before each), the bytes it moves (values read + records written) per second, and the host's
cost of an eager call (median, GPU idle before each): k.write_cache (the compiled launcher,
csrc/launcher.cpp), the same kernel by the Python path (the checks and the ctypes call), and the
torch ops. The kernel and the torch ops are checked to store the same bytes first."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attncc  # noqa: E402
from attncc import bench, storage, validate  # noqa: E402


def run(path: str, n: int, iters: int) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = attncc.compile(path)
    spec = k.spec
    pages = -(-4 * n // spec.page_size)
    gen = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.randperm(pages * spec.page_size, device="cuda", generator=gen)[:n]
    values = {s.name: torch.randn(n, *(() if s.shared else (spec.heads_kv,)), s.dim, device="cuda",
                                  generator=gen).to(torch.bfloat16) for s in spec.segments}
    cache_kernel, cache_torch = k.new_cache(pages), k.new_cache(pages)

    def kernel():
        k.write_cache(cache_kernel, slots, **values)

    def python_path():  # the eager call without the compiled launcher: checks, then the ctypes call
        validate.write_arguments(spec, cache_kernel, slots, values)
        k.op.write_cache(cache_kernel, slots, values)

    def torch_ops():
        storage.write(spec, cache_torch, slots, {name: v if not spec.segment(name).shared else v[:, None]
                                                 for name, v in values.items()})

    kernel()
    torch_ops()
    torch.cuda.synchronize()
    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in
               zip(storage.cache_tensors(cache_kernel).values(), storage.cache_tensors(cache_torch).values()))
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # written before each: L2 flushed
    moved = n * (spec.record_bytes + sum(v[0].numel() * v.element_size() for v in values.values()))
    cells = []
    for name, call in (("kernel", kernel), ("kernel, Python path", python_path), ("torch ops", torch_ops)):
        graph = bench.graph_of(call)
        gpu = bench._median_seconds(graph.replay, lambda: scratch.fill_(1), iters)
        host = bench.host_seconds(call, iters=20)
        cells.append(f"{name}: {gpu * 1e6:8.1f} us GPU ({moved / gpu / 1e9:6.1f} GB/s), {host * 1e6:6.1f} us host")
    return f"{spec.name:18s} n={n:5d}  " + "  |  ".join(cells) + ("" if same else "  BYTES DIFFER")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=[str(ROOT / "examples" / "mla_fp8_sparse.attn"),
                                                     str(ROOT / "examples" / "mla.attn")])
    parser.add_argument("--tokens", default="128,4096")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    for path in args.specs:
        for n in (int(t) for t in args.tokens.split(",")):
            print(run(path, n, args.iters), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
