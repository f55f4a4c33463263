"""Bring your own training loop: the public API a plain PyTorch script uses to train under etj.

    import torch.nn.functional as F
    from etj_trainer import elastic

    with elastic.Job(dataset_size=len(train_set), global_batch_size=256, lr=0.1) as job:
        model = job.setup_model(Net())                     # to job.device; DDP per membership; checkpointed
        job.setup_dynamic_sgd(model.parameters())          # lr, ramp, momentum... from the config
        loader = job.loader(train_set, num_workers=4)      # a torch DataLoader per membership
        for step in job.steps():                           # restores, then one Step per global step
            for x, y in step.batches(loader):              # this rank's share, in micro-batches
                step.backward(F.cross_entropy(model(x), y))  # a mean (or a sum): etj weights it
            step.optimizer_step()                          # commit, optimizer step, checkpoints, progress

What etj guarantees for such a loop (the built-in trainer, ``classifier/trainer.py``, is one such loop):

* **Fixed global batch**: each step's ``global_batch_size`` indices are split over the ranks of the moment
  (uneven shares allowed) and into micro-batches of at most ``micro_batch_size``; gradients are synced
  once, on the last micro-batch. ``step.backward`` takes the micro-batch's mean, sum or per-sample losses
  (which one is read from the graph where certain, else given as ``reduction=``, else refused: loop/loss.py)
  and weights it so that the all-reduced gradient is the mean over the global batch, whatever the split
  (batching/plan.py). An empty share is an empty batch etj builds (``job.loader``). ``backward(loss,
  count=n)`` weighs a micro-batch by a count of its own (tokens) instead: the mean over the global batch's
  counts. A step whose micro-batches did not all run is refused; ``step.clip_gradients`` clips (fp16 too).
* **One config precedence**: ``Job(config=...)`` as given; else the ``ETJ_*`` environment over ``Job``'s
  keywords over ``TrainConfig``'s defaults, with a ``ConfigOverridden`` warning when the environment
  overrides a keyword; keywords and environment alike pass ``TrainConfig``'s one validation before any
  collective (choices, sizes, micro-batch at most the global batch).
* **Loaders that follow the world** (loop/loader.py): ``job.loader`` opens a ``DataLoader`` (or your own
  stream) per membership on exactly this rank's micro-batches, and drops its read-ahead on a resize.
* **Exactly-once sampling** of ``range(dataset_size)``: a ``(seed, epoch)`` permutation read from one
  global position, which checkpoints and resizes carry over (batching/sampler.py).
* **Dynamic SGD**: with ``resizePolicy: DynamicSGD`` the optimizer must be ``elastic.DynamicSGD``; its LR
  multiplier follows the world size. The config's LR schedule (``spec.training``) is applied to it too.
* **Checkpoints** of everything registered (``setup_model``, ``setup_optimizer``, ``register``) plus the
  sampler, the step and the RNG: a shared copy every ``checkpoint_interval_steps`` (written in the
  background) and just in time when a pod leaves; a node-local copy when the process stops and as a
  background snapshot (checkpoint/store.py's StateWriter). On start the world restores the newest copy any
  rank has.
* **Resizes at step boundaries, in process** (resize/inplace.py): a graceful leave re-forms the world among
  the survivors (the next step simply runs on fewer ranks); a joining node's ranks are admitted at a step
  boundary and get the state from rank 0; when a peer dies mid-step, the survivors re-form without it and
  redo the step. Whatever cannot be done in place restarts the processes, which resume from the newest
  copy.
* **Sharded models** (``parallelism`` FSDP or HSDP, loop/_sharding.py): ``setup_model`` shards the module
  with FSDP2 (``shard=``: the submodules that are units of their own; ``mixed_precision=``), the steps
  accumulate with one reduction each, checkpoints are DCP directories that load resharded at any world
  size (checkpoint/sharded.py), and every resize takes the restart path from the newest of them.
* **Progress** to the operator (step, loss, rate, batch, LR, resizes, checkpoints) from rank 0.

The step's commit point is its last collective (the loss and every rank's stop code), *before* the
optimizer step: until then nothing a checkpoint holds has changed except what a forward pass touches
(buffers, the RNG), which each step records at its start. So when a collective fails under the calls
above, the state goes back to the last committed step. A lost peer (resize/recover.py) makes the step *lost*:
its remaining calls do nothing (a forward runs the bare module without a collective, ``backward`` and
``optimizer_step`` return at once, ``micro_batches`` stops), and the next iteration of ``steps()``
re-forms the world and yields the same step again, to the same loop body. Any other failure, or a crash
the survivors cannot recover from in place, writes the last committed step as the node-local copy on the
way out: survivors of a crash lose at most the step in progress either way. Collectives of your own
inside a step are outside this: their failure goes up as an error (the restart path).

This module is the API's public face and reference; the code lives in the subpackages (docs/architecture.md):
``Job`` (loop/job.py: the documented calls only, over loop/_engine.py's engine -- the loop, its step
boundary, checkpoints and failures -- and loop/_state.py's trained state), ``Step``, ``ElasticModule`` and
``Membership`` (loop/step.py), ``Loader`` (loop/loader.py), the loss weighting (loop/loss.py), the
in-process resizes (resize/inplace.py), the reports to the operator (loop/report.py), and who this process
is (core/world.py).
"""

from __future__ import annotations

from etj_trainer.batching.dynamic_sgd import DynamicSGD
from etj_trainer.config import ConfigIgnored, ConfigOverridden, Parallelism, TrainConfig
from etj_trainer.core.world import StopFlag
from etj_trainer.data.stream import Micro
from etj_trainer.loop.job import Job, last_job
from etj_trainer.loop.loader import Loader
from etj_trainer.loop.loss import Reduction
from etj_trainer.loop.step import ElasticModule, Membership, Step

__all__ = [
    "ConfigIgnored",
    "ConfigOverridden",
    "DynamicSGD",
    "ElasticModule",
    "Job",
    "Loader",
    "Membership",
    "Micro",
    "Parallelism",
    "Reduction",
    "Step",
    "StopFlag",
    "TrainConfig",
    "last_job",
]
