"""The test bed's commands, `etj cluster ...` and `etj demo ...` (entry points of the `etj.commands` group).

`python -m etj_testbed.cli cluster up` runs them without the installed entry points (tests and scripts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.errors import ClusterError


def _cluster_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="etj cluster", description="the local control plane (etcd, apiserver, kcm, scheduler, kwok)"
    )
    parser.add_argument("action", choices=["build", "up", "down", "status"])
    parser.add_argument("--name", default=None, help="cluster name (default $ETJ_CLUSTER_NAME or 'etj')")
    parser.add_argument("--keep-data", action="store_true", help="down: keep etcd data and certificates")
    parser.add_argument(
        "--all", action="store_true", help="build: helm too (tests and the chart use it; a cluster does not)"
    )
    return parser


def _run_cluster(args: argparse.Namespace) -> int:
    from etj_testbed.localcluster.cluster import LocalCluster

    cluster = LocalCluster.named(args.name)
    if args.action == "build":
        toolchain.ensure_built(names=toolchain.ALL if args.all else toolchain.CORE)
        for path in toolchain.link_tools_into(Path(sys.executable).parent):
            print(f"linked {path}", file=sys.stderr)
        print(toolchain.bin_dir())
    elif args.action == "up":
        kubeconfig = cluster.up()
        print(f"cluster ready: {cluster.layout.server}", file=sys.stderr)
        print(f"  export KUBECONFIG={kubeconfig}", file=sys.stderr)
        print(kubeconfig)  # last stdout line: scripts do KUBECONFIG=$(etj cluster up | tail -1)
    elif args.action == "down":
        cluster.down(keep_data=args.keep_data)
        print("cluster stopped", file=sys.stderr)
    else:
        print(json.dumps(cluster.status(), indent=2))
    return 0


def cluster(argv: list[str]) -> int:
    """the local control plane (etcd, apiserver, kcm, scheduler, kwok): build, up, down, status"""
    args = _cluster_parser().parse_args(argv)
    try:
        return _run_cluster(args)
    except ClusterError as exc:
        print(f"etj: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _kueue_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="etj kueue", description="Kueue's controller on the local cluster (docs/kueue.md)"
    )
    parser.add_argument("action", choices=["build", "up", "down", "status"])
    parser.add_argument("--name", default=None, help="cluster name (default $ETJ_CLUSTER_NAME or 'etj')")
    parser.add_argument(
        "--namespace-label", default=None, help="up: manage Jobs and Pods only in namespaces with KEY=VALUE"
    )
    parser.add_argument(
        "--feature-gates", default="", help="up: Kueue feature gates, e.g. ElasticJobsViaWorkloadSlices=true"
    )
    return parser


def kueue(argv: list[str]) -> int:
    """Kueue's controller on the local cluster: build (cached), up, down, status"""
    from etj_testbed.localcluster import kueue_build
    from etj_testbed.localcluster.cluster import LocalCluster
    from etj_testbed.localcluster.kueue import LocalKueue

    args = _kueue_parser().parse_args(argv)
    gates = {
        k.strip(): v.strip().lower() == "true"
        for k, _, v in (g.partition("=") for g in args.feature_gates.split(",") if g.strip())
    }
    try:
        if args.action == "build":
            print(kueue_build.ensure_built())
            return 0
        cluster = LocalCluster.named(args.name)
        local = LocalKueue(cluster.layout, args.namespace_label, gates or None)
        if args.action == "up":
            if not cluster.healthy():
                raise ClusterError("the local cluster is not running; `etj cluster up` first")
            timings = local.up()
            print(f"kueue ready ({', '.join(f'{k} {v:.1f}s' for k, v in timings.items())})", file=sys.stderr)
            print(cluster.layout.kubeconfig)
        elif args.action == "down":
            local.down()
            print("kueue stopped", file=sys.stderr)
        else:
            print(json.dumps({"built": kueue_build.is_built(), "running": local.healthy()}, indent=2))
        return 0
    except ClusterError as exc:
        print(f"etj: error: {exc}", file=sys.stderr)
        return 1


def demo(argv: list[str]) -> int:
    """the end-to-end spot-interruption demo on the local cluster"""
    from etj_testbed.demo.main import run_demo

    return run_demo(argv)


COMMANDS = {"cluster": cluster, "kueue": kueue, "demo": demo}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m etj_testbed.cli {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
