"""Markdown tables from the replay JSON files (bench/spot_replay.py --out), for docs/economics.md.

.venv/bin/python -m bench.economics.report bench/results/economics/replay-*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

JSON = dict[str, Any]


def _top_badput(arm: JSON) -> str:
    bad = sorted(arm["badput_s"].items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{k} {v:.0f} s" for k, v in bad)


def replay_markdown(reports: list[JSON]) -> str:
    lines = [
        "| trace (start tick) | arm | workers | finished | time s (trace h) | node-h spot / on-demand "
        "| cost USD | goodput | largest badput | accuracy | exactly once |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        for i, arm in enumerate(r["arms"].values()):
            nh = arm["node_hours_trace"]
            lo, hi = arm["replicas"]
            acc = "-" if arm["accuracy"] is None else f"{float(arm['accuracy']):.4f}"
            lines.append(
                f"| {r['trace'] + ' (' + str(r['start_tick']) + ')' if i == 0 else ''} | {arm['arm']} "
                f"| {lo if lo == hi else f'{lo}-{hi}'} | {'yes' if arm['finished'] else 'no'} "
                f"| {arm['wall_s']:.0f} ({arm['trace_hours']:.1f}) | {nh.get('spot', 0):.1f} / "
                f"{nh.get('on-demand', 0):.1f} | {arm['cost_usd']:.2f} | {arm['goodput']:.2f} "
                f"| {_top_badput(arm)} | {acc} | {arm['exactly_once']} |"
            )
    lines += [
        "",
        "| trace | etj / on-demand: cost | time | etj / ckpt-restart: cost | time | ckpt-restart finished |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        od = r["ratios"].get("etj_vs_on_demand", {})
        ck = r["ratios"].get("etj_vs_ckpt_restart", {})
        lines.append(
            f"| {r['trace']} | {od.get('cost', '-')} | {od.get('time', '-')} | {ck.get('cost', '-')} "
            f"| {ck.get('time', '-')} | {ck.get('baseline_finished', '-')} |"
        )
    notes = [f"- {r['trace']}: {r['note']}" for r in reports if r.get("note")]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    reports = [json.loads(Path(p).read_text()) for p in argv]
    print(replay_markdown(reports), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
