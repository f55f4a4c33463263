"""The GPU proof's measurements (run by bench/gpu_check.sh; prints one JSON document).

1. ``decode``: the trainer's DALI input (``DaliImageSource``, the recipe's ``standard`` augmentation: the
   random-resized-crop window decoded by ``fn.decoders.image_slice``, resize, flip, normalise) with
   "mixed" (nvJPEG on the GPU) against "cpu" decoding, img/s, same JPEGs, same batches.
2. ``train``: ResNet-50, bf16 autocast, channels_last, SGD (Nesterov) on one GPU: img/s fed by that DALI
   pipeline against the same model on synthetic batches already on the GPU (the input pipeline's ceiling).
   Goal: DALI-fed >= 0.95 x synthetic and >= 3,000 img/s on one H100.

The JPEGs are made here (no data set on the machine, no network): ``--images`` smooth random images of
``--jpeg-size`` pixels at JPEG quality 90 (ImageNet-like sizes: ~100 KB at 500x375), in a webdataset-style
tar as the trainer reads it. ``--smoke`` runs every code path on CPU at toy sizes (CI, laptops): tiny images,
a few batches, ResNet-18 at 32x32, CPU decoding only; its numbers mean nothing.

    python bench/gpu_check.py --out gpu_check.json            # on a CUDA machine
    python bench/gpu_check.py --smoke                          # anywhere
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def make_jpeg_tar(path: Path, n: int, size: tuple[int, int], seed: int = 0) -> Path:
    """``n`` smooth random RGB JPEGs (low-frequency noise upsampled, plus grain) with labels 0..999."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            low = rng.integers(0, 256, (max(2, h // 32), max(2, w // 32), 3), dtype=np.uint8)
            img = Image.fromarray(low).resize((w, h), Image.Resampling.BICUBIC)
            arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (h, w, 3))
            buf = io.BytesIO()
            Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
            for name, data in ((f"{i:07d}.jpg", buf.getvalue()), (f"{i:07d}.cls", str(i % 1000).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _source(tar: Path, image_size: int, batch: int, gpu: bool, threads: int) -> Any:
    from etj_trainer.data.augment import Augmentation
    from etj_trainer.data.dali_input import DaliImageSource, list_tar_samples
    from etj_trainer.data.stream import Augmenter

    return DaliImageSource(
        list_tar_samples(tar),
        image_size=image_size,
        threads=threads,
        max_batch=batch,
        use_gpu=gpu,
        augment=Augmenter(Augmentation.STANDARD, seed=0, min_scale=0.08),
    )


def _stream(n: int, batch: int, batches: int, epoch0: int = 0) -> list[Any]:
    from etj_trainer.batching.sampler import ElasticSampler
    from etj_trainer.data.stream import Micro

    s, out = ElasticSampler(n, seed=0), []
    while len(out) < batches:
        idx = s.next_global_batch(batch)
        if len(idx) == batch:  # full batches only: the rate is per image, the tail would skew it
            out.append(Micro(s.epoch + epoch0, idx))
        s.commit(len(idx))
    return out


def decode_rate(tar: Path, image_size: int, batch: int, batches: int, gpu: bool, threads: int) -> float:
    """img/s of the trainer's DALI source (after a 3-batch warm-up that builds the pipeline)."""
    src = _source(tar, image_size, batch, gpu, threads)
    stream = _stream(src.num_samples, batch, batches + 3)
    it = src.batches(iter(stream))
    n, t0 = 0, 0.0
    for i, (x, _y) in enumerate(it):
        if i == 3:
            if gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        if i >= 3:
            n += len(x)
    if gpu:
        torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t0)
    src.close()
    return rate


def _model(name: str, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    import torchvision

    from etj_trainer.classifier import recipe

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, num_classes=1000)
    model = model.to(device).to(memory_format=recipe.memory_format(device))
    groups = recipe.param_groups(model, 5e-5, True)
    return model, torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)


def train_rate(
    model_name: str, device: torch.device, batch: int, steps: int, warmup: int, data: Any, bf16: bool
) -> float:
    """img/s of forward + backward + step; ``data`` yields (x, y) batches (DALI) or is None (synthetic)."""
    from etj_trainer.classifier import recipe

    model, opt = _model(model_name, device)
    size = 224 if device.type == "cuda" else 32
    synthetic = (
        torch.randn(batch, 3, size, size, device=device),
        torch.randint(0, 1000, (batch,), device=device),
    )
    ctx = recipe.autocast(recipe.Precision.BF16 if bf16 else recipe.Precision.FP32, device)
    t0, n = 0.0, 0
    for i in range(warmup + steps):
        if i == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = next(data) if data is not None else synthetic
        x = recipe.to_device(x, device)
        opt.zero_grad(set_to_none=True)
        with ctx():
            out = model(x)
        F.cross_entropy(out.float(), y.to(device)).backward()
        opt.step()
        if i >= warmup:
            n += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def redo_check(device: torch.device, steps: int = 6, fail_at: int = 3) -> dict[str, Any]:
    """A failed step redone on ``device`` equals the fixed run (issue 24).

    A model with dropout (draws from the device's generator) and BatchNorm (buffers a forward updates)
    trains ``steps`` steps twice: straight, and with step ``fail_at`` attempted once -- forward and backward,
    as when a peer dies before the commit -- then undone by the step's own undo record (loop/step.py's
    lost-step path) and redone. The control arm undoes everything but the CUDA generators: on a GPU its
    dropout masks differ, which is what a redo without them trained on.
    """
    from etj_trainer.core.rng import StepUndo

    def run(fail: bool, keep_cuda_rng: bool = True) -> list[torch.Tensor]:
        torch.manual_seed(0)  # every device's generator too
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64),
            torch.nn.BatchNorm1d(64),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.5),
            torch.nn.Linear(64, 10),
        ).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for i in range(steps):
            x, y = (
                torch.randn(64, 32, generator=g).to(device),
                torch.randint(0, 10, (64,), generator=g).to(device),
            )
            if fail and i == fail_at:
                undo = StepUndo.capture(model)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()  # the attempt whose commit never came
                if not keep_cuda_rng:
                    undo.cuda_rng = []
                undo.restore(model)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return [t.detach().double().cpu() for t in model.state_dict().values()]

    def diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))

    fixed = run(False)
    redone, control = diff(fixed, run(True)), diff(fixed, run(True, keep_cuda_rng=False))
    return {"max_abs_diff": redone, "equal": redone == 0.0, "control_without_cuda_rng_max_abs_diff": control}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, toy sizes: checks the code paths only")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--jpeg-size", default="500x375")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--decode-batches", type=int, default=40)
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=8, help="DALI CPU threads")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/etj-gpu-check"))
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    cuda = torch.cuda.is_available() and not ns.smoke
    if not cuda and not ns.smoke:
        print("gpu_check: no CUDA device (use --smoke to check the code paths on CPU)", file=sys.stderr)
        return 2
    if ns.smoke:
        ns.images, ns.jpeg_size, ns.batch, ns.decode_batches, ns.train_steps = 64, "64x48", 8, 4, 3
    w, h = (int(v) for v in ns.jpeg_size.split("x"))
    ns.work_dir.mkdir(parents=True, exist_ok=True)
    tar = ns.work_dir / f"jpegs-{ns.images}-{w}x{h}.tar"
    if not tar.exists():
        make_jpeg_tar(tar.with_suffix(".tmp"), ns.images, (w, h)).rename(tar)
    image_size = 224 if cuda else 32
    device = torch.device("cuda" if cuda else "cpu")
    result: dict[str, Any] = {
        "bench": "gpu_check",
        "smoke": ns.smoke,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "jpeg": {
            "count": ns.images,
            "size": ns.jpeg_size,
            "mean_kb": round(tar.stat().st_size / ns.images / 1024, 1),
        },
        "batch": ns.batch,
    }
    try:
        import nvidia.dali

        result["dali"] = nvidia.dali.__version__
    except ImportError as e:
        result["dali"] = f"missing: {e}"
        print(json.dumps(result, indent=2))
        return 1
    decode: dict[str, Any] = {
        "cpu_img_s": round(decode_rate(tar, image_size, ns.batch, ns.decode_batches, False, ns.threads), 1)
    }
    if cuda:
        decode["mixed_img_s"] = round(
            decode_rate(tar, image_size, ns.batch, ns.decode_batches, True, ns.threads), 1
        )
        decode["mixed_over_cpu"] = round(decode["mixed_img_s"] / decode["cpu_img_s"], 2)
    result["decode"] = decode

    result["train"] = train_section(tar, image_size, ns, cuda, device)
    result["redo"] = redo_check(device)
    text = json.dumps(result, indent=2)
    print(text)
    if ns.out:
        ns.out.write_text(text + "\n")
    return 0


def train_section(
    tar: Path, image_size: int, ns: argparse.Namespace, cuda: bool, device: torch.device
) -> dict[str, Any]:
    """Training throughput on synthetic batches and on DALI's, and whether DALI keeps up."""
    model_name = "resnet50" if cuda else "resnet18"
    warmup = 10 if cuda else 1
    synthetic = train_rate(model_name, device, ns.batch, ns.train_steps, warmup, None, bf16=cuda)
    src = _source(tar, image_size, ns.batch, cuda, ns.threads)
    fed = src.batches(iter(_stream(src.num_samples, ns.batch, ns.train_steps + warmup + 2)))
    dali = train_rate(model_name, device, ns.batch, ns.train_steps, warmup, fed, bf16=cuda)
    fed.close()
    src.close()
    return {
        "model": model_name,
        "precision": "bf16" if cuda else "fp32",
        "channels_last": cuda,
        "synthetic_img_s": round(synthetic, 1),
        "dali_img_s": round(dali, 1),
        "dali_over_synthetic": round(dali / synthetic, 3),
        "goal": ">= 0.95 and >= 3000 img/s on one H100",
        "met": bool(cuda and dali / synthetic >= 0.95 and dali >= 3000),
    }


if __name__ == "__main__":
    sys.exit(main())
