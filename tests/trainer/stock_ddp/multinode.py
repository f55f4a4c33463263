"""A stock torchrun script, written as pytorch/examples' DDP tutorial (ddp-tutorial-series/multinode.py) is:
its own init_process_group (env://), a sibling module, a DistributedSampler, a snapshot file that rank 0
writes each epoch and every rank resumes from. Nothing in it knows etj; tests/trainer/test_stock_scripts.py
runs it under `etj-train local --launcher Torchrun` through a leave, a kill and a join.

Two changes from the tutorial, neither touching the distributed part: the device lines are CPU's (gloo),
and --batch-seconds paces each batch so that a resize lands mid-epoch; each start and each epoch is
appended to --record as a JSON line (what the test reads).
"""

import json
import os
import time

import torch
import torch.nn.functional as F
from datautils import MyTrainDataset
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, record, batch_seconds):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.record = record
        self.batch_seconds = batch_seconds
        resumed = None
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            resumed = self._load_snapshot(snapshot_path)
        self._write(
            event="start",
            resumed=resumed,
            env={k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                                                  "TORCHELASTIC_RESTART_COUNT", "ETJ_SIGTERM_GRACE_SECONDS")},
            world=torch.distributed.get_world_size(),
        )
        self.model = DDP(self.model)

    def _write(self, **fields):
        with open(self.record, "a") as f:
            f.write(json.dumps({"rank": self.global_rank, "pid": os.getpid(), **fields}) + "\n")

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")
        return self.epochs_run

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)
            time.sleep(self.batch_seconds)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
            self._write(event="epoch", epoch=epoch, world=torch.distributed.get_world_size())


def load_train_objs():
    train_set = MyTrainDataset(256)
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))


def main(save_every, total_epochs, batch_size, snapshot_path, record, batch_seconds):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, record, batch_seconds)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device")
    parser.add_argument("--snapshot", default="snapshot.pt")
    parser.add_argument("--record", default="record.jsonl")
    parser.add_argument("--batch-seconds", type=float, default=0.0)
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot, args.record, args.batch_seconds)
