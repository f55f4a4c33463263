"""The sharded example (issue 41 item 4): examples/sharded-lm/train.py, a byte-level GPT on the standard
library's source, trains with FSDP over 2 ranks under ``etj-train local``: its per-token loss falls and it
writes DCP checkpoints, one shard file per rank. Tiny settings (a 43k-parameter model, 40 kB of text, 30
steps) through the script's flags and the ``ETJ_*`` environment."""

from __future__ import annotations

import json
import math
from pathlib import Path

from etj_trainer.agent.local_launcher import run_local

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sharded-lm" / "train.py"
TINY = ["--corpus-bytes", "40000", "--seq-len", "32", "--dim", "32", "--layers", "2", "--heads", "2"]


def test_the_sharded_lm_example_trains_with_fsdp_and_writes_dcp_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    env = {
        "ETJ_SCRIPT": json.dumps([str(EXAMPLE), *TINY, "--sample-bytes", "8", "--loader-workers", "0"]),
        "ETJ_PARALLELISM": "FSDP",
        "ETJ_GLOBAL_BATCH_SIZE": "16",
        "ETJ_MICRO_BATCH_SIZE": "4",  # 8 per rank: 2 micro-batches, the gradients reduced once a step
        "ETJ_MAX_STEPS": "30",
        "ETJ_CHECKPOINT_INTERVAL_STEPS": "15",
        "ETJ_CHECKPOINT_DIR": str(ckpt),
    }
    logs = tmp_path / "logs"
    result = run_local(2, [], env, logs, timeout_s=300)
    text = "".join(f.read_text(errors="replace") for f in sorted(logs.glob("worker-*.log")))
    assert result.get("finished") is True, (result, text[-3000:])
    assert result["step"] == 30 and result["worldSize"] == 2
    assert "(FSDP over 2 ranks)" in text and "\nsample:\ndef " in text
    # the script's metrics are in its ETJ_RESULT line (the progress report keeps the fields it knows)
    line = next(ln for ln in text.splitlines() if ln.startswith("ETJ_RESULT "))
    final = json.loads(line.removeprefix("ETJ_RESULT "))
    first, last = final["first_loss"], final["loss"]
    assert last == result["loss"]
    assert abs(first - math.log(257)) < 0.5, first  # an untrained model: about uniform over the bytes
    assert last < first - 1.0, (first, last)  # it learned (5.7 -> about 3.3 in 30 steps)
    for step in (15, 30):  # the interval's checkpoint and the end's: DCP, a shard file per rank
        written = ckpt / f"dcp-{step:09d}"
        assert (written / ".metadata").is_file(), sorted(p.name for p in ckpt.iterdir())
        assert sorted(p.name for p in written.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
