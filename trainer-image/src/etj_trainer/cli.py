"""``etj-train``: store | worker | local | train | make-digits | prepare."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TRAIN_FLAGS = {  # flag -> env var (the same ETJ_* the operator sets, plus trainer extensions)
    "data": "ETJ_DATA",
    "val_data": "ETJ_VAL_DATA",
    "model": "ETJ_MODEL",
    "epochs": "ETJ_EPOCHS",
    "max_steps": "ETJ_MAX_STEPS",
    "global_batch_size": "ETJ_GLOBAL_BATCH_SIZE",
    "micro_batch_size": "ETJ_MICRO_BATCH_SIZE",
    "resize_policy": "ETJ_RESIZE_POLICY",
    "dsgd_ramp_steps": "ETJ_DSGD_RAMP_STEPS",
    "seed": "ETJ_SEED",
    "lr": "ETJ_LR",
    "checkpoint_dir": "ETJ_CHECKPOINT_DIR",
    "checkpoint_interval_steps": "ETJ_CHECKPOINT_INTERVAL_STEPS",
    "sample_log_dir": "ETJ_SAMPLE_LOG_DIR",
    "dtype": "ETJ_DTYPE",
    "min_step_seconds": "ETJ_MIN_STEP_SECONDS",
    # the training recipe (spec.training.optimizer / lrSchedule / precision / augmentation)
    "momentum": "ETJ_MOMENTUM",
    "weight_decay": "ETJ_WEIGHT_DECAY",
    "no_wd_norm_bias": "ETJ_NO_WD_NORM_BIAS",
    "label_smoothing": "ETJ_LABEL_SMOOTHING",
    "lr_schedule": "ETJ_LR_SCHEDULE",
    "warmup_epochs": "ETJ_WARMUP_EPOCHS",
    "lr_milestones": "ETJ_LR_MILESTONES",
    "lr_gamma": "ETJ_LR_GAMMA",
    "lr_power": "ETJ_LR_POWER",
    "lr_final_fraction": "ETJ_LR_FINAL_FRACTION",
    "precision": "ETJ_PRECISION",
    "augment": "ETJ_AUGMENT",
    "min_crop_scale": "ETJ_MIN_CROP_SCALE",
    "val_resize": "ETJ_VAL_RESIZE",
    "image_size": "ETJ_IMAGE_SIZE",
}
SWITCHES = {"nesterov": "ETJ_NESTEROV"}  # flags without a value: present = on
CHOICES = {
    "lr_schedule": ("constant", "step", "cosine", "poly"),
    "precision": ("fp32", "bf16", "fp16"),
    "augment": ("none", "standard"),
    "no_wd_norm_bias": ("true", "false"),
}


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    for name in TRAIN_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, choices=CHOICES.get(name))
    for name in SWITCHES:
        p.add_argument("--" + name.replace("_", "-"), dest=name, action="store_const", const="1")


def _train_env(ns: argparse.Namespace) -> dict[str, str]:
    flags = {**TRAIN_FLAGS, **SWITCHES}
    return {env: str(getattr(ns, k)) for k, env in flags.items() if getattr(ns, k) is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="etj-train")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("store", help="rendezvous pod: TCPStore + HTTP progress server")
    st.add_argument("--host", default="0.0.0.0")
    st.add_argument("--port", type=int, default=29400)
    st.add_argument("--http-port", type=int, default=29401)
    sub.add_parser("worker", help="worker pod: elastic agent from the ETJ_* environment")
    lo = sub.add_parser("local", help="run store + N agents on loopback, resizing on a schedule")
    lo.add_argument("--nodes", type=int, default=2)
    lo.add_argument("--max-nodes", type=int, default=0, help="rendezvous max (default: peak of the schedule)")
    lo.add_argument(
        "--schedule", default="", help="e.g. 20:+1,40:-2,60:!1 (step:+K start, -K SIGTERM, !K SIGKILL)"
    )
    lo.add_argument("--log-dir", type=Path, default=Path("etj-local-logs"))
    _add_train_flags(lo)
    tr = sub.add_parser("train", help="single process (or under your own torchrun)")
    _add_train_flags(tr)
    md = sub.add_parser("make-digits", help="write scikit-learn digits as JPEG folders + tar shards")
    md.add_argument("out_dir", type=Path)
    md.add_argument("--image-size", type=int, default=32)
    pr = sub.add_parser(
        "prepare", help="write a public data set in the packed format (DIR/train.tar, val.tar)"
    )
    pr.add_argument("dataset", choices=["fashion-mnist"])
    pr.add_argument("out_dir", type=Path)
    pr.add_argument("--image-size", type=int, default=None, help="resize (default: keep 28x28)")
    pr.add_argument("--limit", type=int, default=0, help="first N samples of each split (smoke tests)")
    ns = ap.parse_args(argv)

    if ns.cmd == "store":
        from etj_trainer.store_server import serve

        serve(ns.host, ns.port, ns.http_port)
        return 0
    if ns.cmd == "worker":
        from etj_trainer.agent import main as worker_main

        return worker_main()
    if ns.cmd == "local":
        from etj_trainer.local_launcher import main as local_main
        from etj_trainer.local_launcher import parse_schedule

        peak, n = ns.nodes, ns.nodes
        for ev in parse_schedule(ns.schedule):
            n += ev.count if ev.action == "+" else -ev.count
            peak = max(peak, n)
        env = {"ETJ_MAX_WORKERS": str(ns.max_nodes or peak), **_train_env(ns)}
        return local_main(ns.nodes, ns.schedule, env, ns.log_dir)
    if ns.cmd == "train":
        import os

        import torch.distributed as dist

        from etj_trainer.config import TrainConfig
        from etj_trainer.trainer import StopFlag, train

        cfg = TrainConfig.from_env({**os.environ, **_train_env(ns)})
        stop = StopFlag()
        stop.install()
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group("gloo")
        train(cfg, stop)
        return 0
    if ns.cmd == "make-digits":
        from etj_trainer.digits import make_digits

        print(make_digits(ns.out_dir, ns.image_size))
        return 0
    if ns.cmd == "prepare":
        from etj_trainer import fashion_mnist

        try:
            print(fashion_mnist.prepare(ns.out_dir, ns.image_size, ns.limit))
        except fashion_mnist.MissingDataset as e:
            print(f"etj-train: {e}", file=sys.stderr)
            return 1
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
