"""``etj-train``: store | worker | local | train | make-digits | prepare."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from etj_contract import env as etj_env
from etj_contract.ports import PROGRESS_PORT, RDZV_PORT, STORE_MAX_OPEN_FILES

# --<field> flag -> the variable it sets (etj_contract.env marks which are flags).
TRAIN_FLAGS = {var.field: var.name for var in etj_env.TRAIN_FLAGS if var.field is not None}
# Boolean variables: `--nesterov` alone means on, `--nesterov false` / `--no-wd-norm-bias false` set a value.
SWITCHES = {var.field for var in etj_env.TRAIN_FLAGS if var.parse is etj_env.truthy}
CHOICES = {v.field: v.parse.options for v in etj_env.TRAIN_FLAGS if isinstance(v.parse, etj_env.Choice)}


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    for name in TRAIN_FLAGS:
        flag = "--" + name.replace("_", "-")
        if name in SWITCHES:
            p.add_argument(flag, dest=name, default=None, nargs="?", const="true")
        else:
            p.add_argument(flag, dest=name, default=None, choices=CHOICES.get(name))


def _train_env(ns: argparse.Namespace) -> dict[str, str]:
    return {env: str(getattr(ns, k)) for k, env in TRAIN_FLAGS.items() if getattr(ns, k) is not None}


def _add_script(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--script",
        nargs=argparse.REMAINDER,
        default=None,
        metavar="PATH [ARGS]",
        help="run your own training script (etj_trainer.elastic) instead of the built-in trainer; "
        "everything after PATH goes to it (last option)",
    )
    p.add_argument(
        "--launcher",
        choices=etj_env.LAUNCHERS,
        default=None,
        help="Torchrun: run --script unchanged, as torchrun does (python script.py semantics, torch "
        "elastic's environment, no group formed for it; every membership change restarts it); default Etj "
        "(ETJ_LAUNCHER, docs/porting.md)",
    )


def _script_env(script: list[str] | None, launcher: str | None = None) -> dict[str, str]:
    """``ETJ_SCRIPT`` for ``--script PATH ARGS`` (the argv as a JSON list, the path made absolute) and
    ``ETJ_LAUNCHER`` for ``--launcher``."""
    env = {etj_env.LAUNCHER.name: launcher} if launcher else {}
    if not script:
        return env
    import json
    import os

    path = script[0] if script[0] == "-m" else os.path.abspath(script[0])
    return {**env, etj_env.SCRIPT.name: json.dumps([path, *script[1:]])}


def _refused(cmd: str, env: Mapping[str, str]) -> bool:
    """Check the job's inputs (agent/preflight.py) before anything starts; print each problem by flag."""
    import os

    from etj_trainer.agent import preflight

    refusals = preflight.check({**os.environ, **env})
    for r in refusals:
        print(f"etj-train {cmd}: {r.for_cli()}", file=sys.stderr)
    return bool(refusals)


def main(argv: list[str] | None = None) -> int:
    """``etj-train``.

    Long because: the commands' flags are one flat argparse list, then the dispatch on them.
    """
    ap = argparse.ArgumentParser(prog="etj-train")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("store", help="rendezvous pod: TCPStore + HTTP progress server")
    st.add_argument("--host", default="0.0.0.0")
    st.add_argument("--port", type=int, default=RDZV_PORT)
    st.add_argument("--http-port", type=int, default=PROGRESS_PORT)
    st.add_argument(
        "--max-open-files",
        type=int,
        default=STORE_MAX_OPEN_FILES,
        help="the store process's descriptor limit, which caps its TCPStore connections",
    )
    st.add_argument(
        "--no-libuv",
        action="store_true",
        help="torch's poll()-based TCPStore server (behind the store's relay) even where libuv is there",
    )
    wk = sub.add_parser("worker", help="worker pod: elastic agent from the ETJ_* environment")
    _add_script(wk)
    lo = sub.add_parser("local", help="run store + N agents on loopback, resizing on a schedule")
    lo.add_argument("--nodes", type=int, default=2)
    lo.add_argument("--max-nodes", type=int, default=0, help="rendezvous max (default: peak of the schedule)")
    lo.add_argument(
        "--procs-per-node",
        type=int,
        default=1,
        help="training processes (ranks) per node, like a pod's procsPerWorker (default 1)",
    )
    lo.add_argument(
        "--schedule", default="", help="e.g. 20:+1,40:-2,60:!1 (step:+K start, -K SIGTERM, !K SIGKILL)"
    )
    lo.add_argument("--log-dir", type=Path, default=Path("etj-local-logs"))
    _add_train_flags(lo)
    _add_script(lo)
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
        from etj_trainer.service.store_server import serve

        serve(ns.host, ns.port, ns.http_port, max_open_files=ns.max_open_files, libuv=not ns.no_libuv)
        return 0
    if ns.cmd == "worker":
        import os

        from etj_trainer.agent.worker import main as worker_main

        os.environ.update(_script_env(ns.script, ns.launcher))  # inherited by the forkserver and its workers
        return worker_main()
    if ns.cmd == "local":
        from etj_trainer.agent.local_launcher import main as local_main
        from etj_trainer.agent.local_launcher import parse_schedule

        peak, n = ns.nodes, ns.nodes
        for ev in parse_schedule(ns.schedule):
            n += ev.count if ev.action == "+" else -ev.count
            peak = max(peak, n)
        env = {
            etj_env.MAX_WORKERS.name: str(ns.max_nodes or peak),
            **_train_env(ns),
            **_script_env(ns.script, ns.launcher),
        }
        if _refused("local", env):
            return 2
        return local_main(ns.nodes, ns.schedule, env, ns.log_dir, procs_per_node=ns.procs_per_node)
    if ns.cmd == "train":
        import os

        from etj_trainer.classifier.trainer import StopFlag, train
        from etj_trainer.config import TrainConfig

        if _refused("train", _train_env(ns)):
            return 2
        cfg = TrainConfig.from_env({**os.environ, **_train_env(ns)})
        stop = StopFlag()
        stop.install()
        train(cfg, stop)  # under torchrun (WORLD_SIZE set), the Job binds the GPU and forms the group
        return 0
    if ns.cmd == "make-digits":
        from etj_trainer.data.digits import make_digits

        print(make_digits(ns.out_dir, ns.image_size))
        return 0
    if ns.cmd == "prepare":
        from etj_trainer.data import fashion_mnist

        try:
            print(fashion_mnist.prepare(ns.out_dir, ns.image_size, ns.limit))
        except fashion_mnist.MissingDataset as e:
            print(f"etj-train: {e}", file=sys.stderr)
            return 1
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
