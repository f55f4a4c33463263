"""`etj demo`: an ElasticTrainingJob rides out a spot interruption on the local control plane.

The command line (its first docstring line is `etj demo --help`'s description): runs the local `Demo` or
the installed-operator `ClusterDemo`, then the fixed-size reference, and prints the resizes and the final
accuracies.
"""

from __future__ import annotations

import argparse
import copy
import signal
import sys
import time
from pathlib import Path

import yaml

from etj_testbed.demo.cluster import make_demo
from etj_testbed.demo.local import Demo
from etj_testbed.demo.script import INSTANCE, JSON, REPO, DemoResult, Script
from etj_testbed.demo.view import Live, describe_resize, logged_accuracy, write_timeline
from etj_testbed.localcluster import toolchain


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="etj demo", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting the local one")
    p.add_argument(
        "--operator",
        choices=["local", "installed"],
        default="local",
        help="local: start the operator, the process-node harness and process nodes here (default); "
        "installed: use the operator already installed on --kubeconfig's cluster (the chart) and its own "
        "nodes, and interrupt a spot node through the API",
    )
    p.add_argument(
        "--trainer-image",
        help="installed: spec.trainer.image (default: none, so the operator's default trainer image is used)",
    )
    p.add_argument("--image-pull-policy", choices=["Always", "IfNotPresent", "Never"], help="installed")
    p.add_argument(
        "--shared-dir",
        type=Path,
        help="installed: a directory this machine and every node see at the same path (kind extraMounts); "
        "checkpoints and sample logs go there (the run directory is placed inside it)",
    )
    p.add_argument("--namespace", default="etj-demo")
    p.add_argument("--manifest", type=Path, default=REPO / "examples" / "demo-cpu.yaml")
    p.add_argument(
        "--timeline",
        type=Path,
        help="where the PNG goes (default: the run directory; the README's picture is refreshed with "
        "--timeline docs/demo-timeline.png -- by default a demo run changes no tracked file)",
    )
    p.add_argument(
        "--run-dir", type=Path, help="logs, checkpoints, sample logs (default: a new dir in the cache)"
    )
    p.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip the fixed-size reference run whose accuracy is printed next to the elastic run's",
    )
    p.add_argument("--interrupt-epoch", type=int, default=Script.interrupt_epoch)
    p.add_argument("--return-after", type=float, default=Script.return_after_s, help="seconds")
    p.add_argument("--timeout", type=float, default=Script.timeout_s, help="seconds")
    p.add_argument(
        "--keep", action="store_true", help="leave the job (not the processes) in place at the end"
    )
    return p.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(argv: list[str]) -> int:
    """`etj demo`: argv → a cluster → the demo (`local.Demo`, or `cluster.ClusterDemo` with `--operator
    installed`, with `etj demo`'s scenario, `scenario.SpotInterruption`) → its run → the report."""
    args = parse_args(argv)
    installed = args.operator == "installed"
    if installed and args.kubeconfig is None:
        print(
            "etj demo: --operator installed needs --kubeconfig (a cluster with the chart installed)",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig is None:
        from etj_testbed.localcluster.cluster import LocalCluster

        print("starting the local control plane (first run builds it; see README)…", file=sys.stderr)
        args.kubeconfig = LocalCluster.named().up()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = args.shared_dir / "demo" if installed and args.shared_dir else toolchain.cache_root() / "demo"
    run_dir = args.run_dir or base / stamp
    manifest = yaml.safe_load(args.manifest.read_text())
    script = Script(args.interrupt_epoch, return_after_s=args.return_after, timeout_s=args.timeout)
    # Ctrl-C and SIGTERM both end in the cleanup below; SIGINT may arrive ignored (a background job of a
    # script), so its handler is set explicitly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    contents = "checkpoints, samples" if installed else "operator.log, proclet.log, pods/*/*.log"
    print(f"run directory: {run_dir} ({contents})", file=sys.stderr)
    try:
        result = _run_one(_make(args, args.namespace, run_dir, manifest, script, INSTANCE), args.keep)
        rows = [("elastic run (spot interruption and return)", _report(result, run_dir, args))]
        if args.reference and result.phase == "Succeeded":
            rows.append(_reference(args, manifest, run_dir))
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    _print_accuracy(rows)
    return 0 if result.phase == "Succeeded" else 1


def _make(
    args: argparse.Namespace, namespace: str, run: Path, job: JSON, script: Script, instance: str
) -> Demo:
    """The demo for `--operator` (local: `Demo` starts the operator; installed: `ClusterDemo`)."""
    installed = args.operator == "installed"
    return make_demo(
        args.kubeconfig,
        namespace,
        run,
        job,
        script,
        instance,
        installed=installed,
        trainer_image=args.trainer_image,
        pull_policy=args.image_pull_policy,
        shared_dir=args.shared_dir if installed else None,
    )


def _report(result: DemoResult, run_dir: Path, args: argparse.Namespace) -> float | None:
    """The run's resizes and timeline; its accuracy."""
    status = result.status.get("status") or {}
    print(f"\njob {result.phase}; resizes:")
    for r in status.get("resizeHistory") or []:
        print(f"  {describe_resize(r)}")
    print(f"timeline: {write_timeline(result, args.timeline or run_dir / 'timeline.png')}")
    return _accuracy(result, run_dir)


def _reference(args: argparse.Namespace, manifest: JSON, run_dir: Path) -> tuple[str, float | None]:
    """The question a user asks: what did the interruption cost? Same job and seed at the full size
    throughout, no interruption (the e2e test asserts the same comparison)."""
    size = manifest["spec"]["replicas"]["max"]
    fixed = copy.deepcopy(manifest)
    fixed["spec"]["replicas"]["min"] = size
    never = Script(interrupt_epoch=10**6, timeout_s=args.timeout)
    print(f"\nreference: the same job on a fixed {size} workers, no interruption…", file=sys.stderr)
    ref_dir = run_dir / "fixed-size"
    ref = _run_one(_make(args, f"{args.namespace}-fixed", ref_dir, fixed, never, "fixed"), False)
    return (f"fixed-size run ({size} workers, no interruption)", _accuracy(ref, ref_dir))


def _print_accuracy(rows: list[tuple[str, float | None]]) -> None:
    print("\nfinal validation accuracy:")
    for label, accuracy in rows:
        print(f"  {label:<48} {'-' if accuracy is None else f'{accuracy:.4f}'}")
    if len(rows) == 2 and rows[0][1] is not None and rows[1][1] is not None:
        print(f"  difference: {100 * (rows[0][1] - rows[1][1]):+.2f} percentage points")


def _run_one(demo: Demo, keep: bool) -> DemoResult:
    try:
        demo.start()
        with Live() as live:
            return demo.run(live)
    finally:
        demo.cleanup(delete_job=not keep)


def _accuracy(result: DemoResult, run_dir: Path) -> float | None:
    status = result.status.get("status") or {}
    accuracy: float | None = (status.get("progress") or {}).get("accuracy")
    return accuracy if accuracy is not None else logged_accuracy(run_dir)
