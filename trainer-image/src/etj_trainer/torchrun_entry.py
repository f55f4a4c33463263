"""``torchrun ... -m etj_trainer.torchrun_entry``: the trainer under a stock torchrun (used as the baseline
in bench/resize_pause.py and by users who prefer their own launcher)."""

from etj_trainer.agent.worker_process import worker_entry

if __name__ == "__main__":
    worker_entry()
