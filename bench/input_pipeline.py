"""Input pipeline throughput (img/s): DALI CPU vs torchvision DataLoader, same cores, same JPEGs.

Both decode the digits JPEG folder tree (``etj-train make-digits``), resize to 32x32 and normalise, in
batches of 64 with 2 worker threads/processes; the DALI arm is the trainer's own ``DaliImageSource`` fed by
the elastic sampler's index stream. A GPU ("mixed" nvJPEG decoding) arm runs only with CUDA and is reported
as skipped otherwise. Prints JSON.

    .venv/bin/python bench/input_pipeline.py [--epochs 2] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from etj_trainer.batching.sampler import ElasticSampler
from etj_trainer.data.dali_input import DaliImageSource, list_folder_samples
from etj_trainer.data.sources import ensure_digits
from etj_trainer.data.stream import MEAN, STD


def index_stream(n: int, batch: int, epochs: int) -> list[np.ndarray]:
    s = ElasticSampler(n, seed=0)
    out = []
    while s.epoch < epochs:
        idx = s.next_global_batch(batch)
        out.append(idx)
        s.commit(len(idx))
    return out


def bench_dali(root: Path, batch: int, epochs: int, threads: int, gpu: bool) -> float:
    table = list_folder_samples(root)
    src = DaliImageSource(table, image_size=32, threads=threads, max_batch=batch, use_gpu=gpu)
    stream = index_stream(len(table), batch, epochs)
    it = src.batches(iter(stream[:2]))  # warm-up: pipeline build
    for _ in it:
        pass
    t = time.perf_counter()
    n = 0
    for x, _y in src.batches(iter(stream)):
        n += len(x)
    return n / (time.perf_counter() - t)


def bench_torchvision(root: Path, batch: int, epochs: int, workers: int) -> float:
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [transforms.Resize((32, 32)), transforms.ToTensor(), transforms.Normalize([MEAN] * 3, [STD] * 3)]
    )
    ds = datasets.ImageFolder(str(root), transform=tf)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )
    for _ in zip(range(2), loader, strict=False):  # warm-up: worker start
        pass
    t = time.perf_counter()
    n = 0
    for _ in range(epochs):
        for x, _y in loader:
            n += len(x)
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ns = ap.parse_args()
    root = ensure_digits() / "train"
    result: dict[str, object] = {
        "benchmark": "input_pipeline",
        "images": len(list_folder_samples(root)),
        "epochs": ns.epochs,
        "workers": ns.workers,
        "cpu_count": os.cpu_count(),
    }
    result["torchvision_dataloader_img_s"] = round(
        bench_torchvision(root, ns.batch, ns.epochs, ns.workers), 1
    )
    result["dali_cpu_img_s"] = round(bench_dali(root, ns.batch, ns.epochs, ns.workers, gpu=False), 1)
    if torch.cuda.is_available():
        result["dali_gpu_mixed_img_s"] = round(bench_dali(root, ns.batch, ns.epochs, ns.workers, gpu=True), 1)
    else:
        result["dali_gpu_mixed_img_s"] = "skipped: no CUDA"
    result["dali_cpu_vs_torchvision"] = round(
        float(result["dali_cpu_img_s"]) / float(result["torchvision_dataloader_img_s"]), 2
    )  # type: ignore[arg-type]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
