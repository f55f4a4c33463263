"""A small decoder-only language model, sharded with FSDP under etj: a byte-level GPT (token and position
embeddings, transformer blocks with causal self-attention, an LM head) learning to write Python from the
standard library's own source, which every Python install ships: nothing to download.

On a laptop, 2 ranks (see README.md for a resize and for Kubernetes):

    etj-train local --nodes 2 --parallelism FSDP --global-batch-size 32 --micro-batch-size 8 \
        --lr 0.003 --max-steps 200 --checkpoint-interval-steps 50 --script examples/sharded-lm/train.py

What is sharded (``job.setup_model(..., shard=(Block,))``): each transformer block is a unit of its own,
its parameters gathered for its own forward and backward only, and the root (embeddings, final norm, head)
is the last unit; gradients and AdamW's state are sharded the same way, and checkpoints are DCP directories
(``dcp-<step>/``) that load resharded at any world size. Under ``--parallelism DDP`` the same script trains
a full replica per rank. The loss is the mean over the global batch's *tokens*: each micro-batch's mean
cross-entropy is weighted by its own count of predicted bytes (``step.backward(loss, count=n)``), so a
sequence cut short at the end of a file weighs what its bytes weigh, whatever ranks it lands on.
"""

from __future__ import annotations

import argparse
import math
import os
import sysconfig
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils.data import Dataset

from etj_trainer import elastic

PAD = 256  # bytes are 0..255; the padding after a file's last byte is token 256
VOCAB = 257
IGNORE = -100  # F.cross_entropy's ignore_index: a padded position predicts nothing
SKIP = {"site-packages", "dist-packages", "__pycache__"}  # installed packages differ between machines


def stdlib_sources(max_bytes: int) -> list[bytes]:
    """The standard library's ``.py`` files in sorted path order, whole, until ``max_bytes`` are read (the
    last one cut): the same corpus on every rank and every run of one Python version."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths: list[str] = []
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP]
        paths += [os.path.relpath(os.path.join(top, f), root) for f in files if f.endswith(".py")]
    docs, left = [], max_bytes
    for rel in sorted(p.replace(os.sep, "/") for p in paths):
        if left <= 0:
            break
        text = (root / rel).read_bytes()[:left]
        docs.append(text)
        left -= len(text)
    return docs


class ByteChunks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each file cut into sequences of ``seq_len`` input bytes and their next bytes (the targets); a file's
    last sequence is padded, its padded targets ignored. A map-style dataset of fixed-length samples."""

    def __init__(self, docs: list[bytes], seq_len: int) -> None:
        rows = []
        for doc in docs:
            for start in range(0, len(doc) - 1, seq_len):  # a piece holds at least one target
                piece = torch.frombuffer(bytearray(doc[start : start + seq_len + 1]), dtype=torch.uint8)
                row = torch.full((seq_len + 1,), PAD, dtype=torch.int16)
                row[: len(piece)] = piece.to(torch.int16)
                rows.append(row)
        self.rows = torch.stack(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.rows[i].long()
        x, y = row[:-1], row[1:].clone()
        y[y == PAD] = IGNORE
        return x, y


class Block(nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then a 4x GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, d / heads)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class ByteGPT(nn.Module):
    def __init__(self, seq_len: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))  # (batch, seq_len, VOCAB)
        return logits


class LossLog:
    """Each step's loss, checkpointed with the job (``job.register``): a restart keeps the curve."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = list(state["losses"])


@torch.no_grad()
def complete(model: nn.Module, prompt: bytes, n: int, seq_len: int, device: torch.device) -> bytes:
    """``n`` bytes after ``prompt``, greedily. Every rank runs it: a sharded forward gathers from all."""
    idx = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    for _ in range(n):
        logits = model(idx[:, -seq_len:])[0, -1, :PAD]  # never the padding token
        idx = torch.cat([idx, logits.argmax().view(1, 1)], dim=1)
    return bytes(idx[0, len(prompt) :].tolist())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus-bytes", type=int, default=2_000_000)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--sample-bytes", type=int, default=120, help="bytes generated at the end (0: none)")
    ap.add_argument("--loader-workers", type=int, default=1)
    args = ap.parse_args()

    train_set = ByteChunks(stdlib_sources(args.corpus_bytes), args.seq_len)
    torch.manual_seed(0)  # the same initial model on every rank (FSDP shards it as it is)
    net = ByteGPT(args.seq_len, args.dim, args.layers, args.heads)
    n_params = sum(p.numel() for p in net.parameters())
    # The ETJ_* environment (the operator's job spec, etj-train flags) overrides these keywords.
    with elastic.Job(
        dataset_size=len(train_set),
        global_batch_size=32,
        micro_batch_size=8,
        lr=3e-3,
        weight_decay=0.01,
        parallelism=elastic.Parallelism.FSDP,
        checkpoint_interval_steps=50,
    ) as job:
        # bf16 compute with fp32 gradient reduction on a GPU; plain fp32 on CPU. Ignored under DDP.
        cuda = job.device.type == "cuda"
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else None
        model = job.setup_model(net, shard=(Block,), mixed_precision=mixed)  # each Block, then the root
        # AdamW over the sharded parameters (its state is sharded too); a resizePolicy of FixedGlobalBatch
        # (DynamicSGD needs elastic.DynamicSGD). Built after setup_model: it must hold the DTensors.
        cfg = job.config
        job.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay))
        log = LossLog()
        job.register("loss_log", log)
        loader = job.loader(train_set, num_workers=args.loader_workers)
        if job.world.rank == 0:
            print(f"sharded-lm: {len(train_set)} sequences of {args.seq_len} bytes, {n_params:,} parameters "
                  f"({cfg.parallelism.value} over {job.world.size} ranks)", flush=True)  # fmt: skip
        for step in job.steps():
            for x, y in step.batches(loader):  # an empty share is an empty batch: run it anyway
                logits = model(x.to(job.device))
                y = y.to(job.device)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE)
                # A mean over this micro-batch's predicted bytes, weighed by their count: the step's loss
                # and gradient are the mean over every predicted byte of the global batch, on all ranks.
                step.backward(loss, count=int((y != IGNORE).sum()))
            step.clip_gradients(1.0)
            step.optimizer_step()
            if not step.committed:
                continue  # a lost step (a peer died; in-place recovery under DDP): it comes again
            log.losses.append(job.loss)
            if job.world.rank == 0 and step.number % 10 == 0:
                print(f"step {step.number}: loss {job.loss:.3f} ({job.loss / math.log(2):.2f} bits/byte)",
                      flush=True)  # fmt: skip
        metrics: dict[str, Any] = {}
        if not job.stopped_early and log.losses:
            metrics["first_loss"] = log.losses[0]
            if args.sample_bytes > 0:
                model.eval()
                text = complete(model, b"def ", args.sample_bytes, args.seq_len, job.device)
                if job.world.rank == 0:
                    print("sample:\ndef " + text.decode("utf-8", errors="replace"), flush=True)
        job.finish(**metrics)


if __name__ == "__main__":
    main()
