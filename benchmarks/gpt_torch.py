"""The PyTorch peer of distnn's ``gpt_mini``: the same model, data and recipe in torch.

The model (``TorchGPT``): token and learned position embeddings, pre-LN decoder blocks
(one fused q/k/v projection, ``F.scaled_dot_product_attention(is_causal=True)``, the
tanh GELU, a 4x feed-forward), a last layer norm, logits tied to the token embedding.
``from_distnn(model)`` copies a distnn gpt_mini's weights into it, so both start from
the same numbers (distnn's initialization: N(0, 0.02) embeddings, Glorot-uniform
projections, zero biases, unit norms).

The recipe (``train``), distnn train's: ``distnn.data.load_dataset("text", context=C,
tokenizer="bytes")`` gives the same windows and splits (default corpus: Debian's
fortunes); AdamW whose weight decay touches only the >= 2-D parameters outside the
embeddings and norms (distnn's default groups); lr * (i + 1) / W0 for the first W0 steps,
then cosine to ``min_lr_ratio`` (distnn's ``CosineDecay``, a ``LambdaLR`` here); the
gradients clipped to a global norm after the backward (after DDP's all-reduce); the
validation loss (mean over every validation window, shared among the ranks) after
every K updates. Several ranks: DDP on gloo over 127.0.0.1, each rank its share of every global
batch; the batch order is torch's own (seeded), not distnn's.

    python benchmarks/gpt_torch.py --ranks 2 --steps 400 --seed 0 --out torch0.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ff1, self.ff2 = nn.Linear(width, ff), nn.Linear(ff, width)

    def forward(self, x, cache=None):
        n, t, e = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(e, dim=2)
        q, k, v = (a.view(n, t, self.heads, e // self.heads).transpose(1, 2) for a in (q, k, v))
        if cache is not None:  # generation: keys and values of the earlier positions
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        causal = cache is None or t > 1
        if cache is not None and t > 1 and k.shape[2] != t:
            raise ValueError("prefill a cache in one call")
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, e))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    """gpt_mini in torch (see the module doc); forward(ids (N, T)) -> logits (N, T, V)."""

    def __init__(self, vocab=256, context=64, width=128, depth=4, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads, 4 * width) for _ in range(depth))
        self.ln = nn.LayerNorm(width)

    def forward(self, ids, caches=None, start: int = 0):
        x = self.tok(ids) + self.pos[start:start + ids.shape[1]]
        for i, b in enumerate(self.blocks):
            x = b(x, None if caches is None else caches[i])
        return self.ln(x) @ self.tok.weight.T


def from_distnn(model, context: int) -> TorchGPT:
    """A TorchGPT with a distnn gpt_mini's weights (float32)."""
    a = {k: torch.tensor(np.asarray(v, np.float32)) for k, v in model.named_arrays().items()}
    depth = sum(1 for k in a if k.endswith("/wq"))
    width = a["embedding_0/w"].shape[1]
    heads = next(layer.attn.num_heads for layer in model.layers if hasattr(layer, "attn"))
    net = TorchGPT(a["embedding_0/w"].shape[0], context, width, depth, heads)
    with torch.no_grad():
        net.tok.weight.copy_(a["embedding_0/w"])
        net.pos.copy_(a["positionalembedding_0/w"][:context])
        for i, b in enumerate(net.blocks):
            m, ln1, ln2 = f"multiheadattention_{i}/", 2 * i, 2 * i + 1
            b.ln1.weight.copy_(a[f"layernormalization_{ln1}/gamma"])
            b.ln1.bias.copy_(a[f"layernormalization_{ln1}/beta"])
            b.ln2.weight.copy_(a[f"layernormalization_{ln2}/gamma"])
            b.ln2.bias.copy_(a[f"layernormalization_{ln2}/beta"])
            b.qkv.weight.copy_(torch.cat([a[m + "wq"].T, a[m + "wk"].T, a[m + "wv"].T]))
            b.qkv.bias.copy_(torch.cat([a[m + "bq"], a[m + "bk"], a[m + "bv"]]))
            b.proj.weight.copy_(a[m + "wo"].T)
            b.proj.bias.copy_(a[m + "bo"])
            for lin, j in ((b.ff1, 2 * i), (b.ff2, 2 * i + 1)):
                lin.weight.copy_(a[f"dense_{j}/w"].T)
                lin.bias.copy_(a[f"dense_{j}/b"])
        net.ln.weight.copy_(a[f"layernormalization_{2 * depth}/gamma"])
        net.ln.bias.copy_(a[f"layernormalization_{2 * depth}/beta"])
    return net


def distnn_init(context: int, seed: int) -> TorchGPT:
    """The TorchGPT that distnn's gpt_mini builds with ``--random_seed seed``."""
    from distnn.models import get_model
    return from_distnn(get_model("gpt_mini", (context,), rng=seed), context)


def param_groups(net: TorchGPT, weight_decay: float):
    """distnn's AdamW default groups: decay on >= 2-D weights outside embeddings/norms."""
    decay = [p for n, p in net.named_parameters()
             if p.ndim >= 2 and not n.startswith(("tok.", "pos"))]
    ids = {id(p) for p in decay}
    rest = [p for p in net.parameters() if id(p) not in ids]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def cosine(warmup: int, total: int, min_ratio: float):
    def f(i):
        if i < warmup:
            return (i + 1) / warmup
        p = min(1.0, (i - warmup) / (total - warmup)) if total > warmup else 1.0
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def _windows(ds) -> tuple[np.ndarray, np.ndarray]:
    x, y = ds.arrays()
    return np.asarray(x, np.int64), np.asarray(y, np.int64)


def train(rank: int, size: int, args) -> dict:
    torch.set_num_threads(1)
    if size > 1:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=size)
    from distnn.data import load_dataset
    splits = load_dataset("text", context=args.context, tokenizer="bytes")
    xt, yt = _windows(splits.train)
    xv, yv = _windows(splits.val)
    net = distnn_init(args.context, args.seed)
    model = net
    if size > 1:
        model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(param_groups(net, args.weight_decay), lr=args.lr,
                            betas=(args.beta1, args.beta2))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine(args.warmup_steps, args.steps, args.min_lr_ratio))
    gen = torch.Generator().manual_seed(args.seed)
    b = args.batch_size
    order, at = torch.randperm(len(xt), generator=gen).numpy(), 0
    curve = []

    def validate(step):
        net.eval()
        with torch.no_grad():
            mine = np.arange(rank, len(xv), size)
            tot = torch.zeros(2, dtype=torch.float64)
            for i in range(0, len(mine), 256):
                j = mine[i:i + 256]
                out = net(torch.from_numpy(xv[j]))
                tot[0] += F.cross_entropy(out.reshape(-1, out.shape[-1]),
                                          torch.from_numpy(yv[j]).reshape(-1),
                                          reduction="sum").double()
                tot[1] += j.size * args.context
            if size > 1:
                torch.distributed.all_reduce(tot)
        net.train()
        curve.append((step, float(tot[0] / tot[1])))

    t0 = time.perf_counter()
    for step in range(args.steps):
        if at + b * size > len(order):
            order, at = torch.randperm(len(xt), generator=gen).numpy(), 0
        j = order[at + rank * b:at + (rank + 1) * b]
        at += b * size
        out = model(torch.from_numpy(xt[j]))
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]),
                               torch.from_numpy(yt[j]).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip_grad_norm:
            nn.utils.clip_grad_norm_(net.parameters(), args.clip_grad_norm)
        opt.step()
        sched.step()
        if args.validate_every and (step + 1) % args.validate_every == 0:
            validate(step + 1)  # after N updates, as distnn train --validate_every N
    seconds = time.perf_counter() - t0
    if not curve or curve[-1][0] != args.steps:
        validate(args.steps)
    if size > 1:
        torch.distributed.destroy_process_group()
    return {"system": "torch", "seed": args.seed, "ranks": size, "steps": args.steps,
            "seconds": seconds, "curve": curve}


def _worker(rank, size, args, queue):
    queue.put((rank, train(rank, size, args)))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--warmup_steps", type=int, default=40)
    p.add_argument("--min_lr_ratio", type=float, default=0.1)
    p.add_argument("--clip_grad_norm", type=float, default=1.0)
    p.add_argument("--validate_every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.ranks == 1:
        result = train(0, 1, args)
    else:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, args.ranks, args, queue))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        results = dict(queue.get() for _ in procs)
        for p in procs:
            p.join()
        result = results[0]
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(f"torch gpt_mini, {args.ranks} ranks: final val_loss {result['curve'][-1][1]:.4f} "
          f"after {args.steps} steps, {result['seconds']:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
