"""The `etj` command: local cluster, operator, CRD generation and the demo."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from etj_operator.localcluster import toolchain
from etj_operator.localcluster.errors import ClusterError


def _cluster(args: argparse.Namespace) -> int:
    from etj_operator.localcluster.cluster import LocalCluster

    cluster = LocalCluster.named(args.name)
    if args.action == "build":
        toolchain.ensure_built()
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


def _operator(args: argparse.Namespace, rest: list[str]) -> int:
    from etj_operator.runner import run_operator

    return run_operator(rest)


def _crd(args: argparse.Namespace, rest: list[str]) -> int:
    from etj_operator.api.crd import main as crd_main

    return crd_main(rest)


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from etj_operator.demo import run_demo

    return run_demo(rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etj", description="ElasticTrainingJob: elastic PyTorch on K8s")
    sub = parser.add_subparsers(dest="command", required=True)

    cluster = sub.add_parser(
        "cluster", help="the local control plane (etcd, apiserver, kcm, scheduler, kwok)"
    )
    cluster.add_argument("action", choices=["build", "up", "down", "status"])
    cluster.add_argument("--name", default=None, help="cluster name (default $ETJ_CLUSTER_NAME or 'etj')")
    cluster.add_argument("--keep-data", action="store_true", help="down: keep etcd data and certificates")

    sub.add_parser(
        "operator", help="run the operator: `etj operator run [--namespace NS] ...`", add_help=False
    )
    sub.add_parser("crd", help="`etj crd generate`: write crds/ from the pydantic models", add_help=False)
    sub.add_parser("demo", help="the end-to-end spot-interruption demo on the local cluster", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # operator/crd/demo forward their own flags to the module that owns them.
    if argv and argv[0] in ("operator", "crd", "demo"):
        command, rest = argv[0], argv[1:]
        if command in ("operator", "crd") and rest and rest[0] in ("run", "generate"):
            rest = rest[1:]
        handler = {"operator": _operator, "crd": _crd, "demo": _demo}[command]
        return handler(argparse.Namespace(), rest)
    args = parser.parse_args(argv)
    try:
        return _cluster(args)
    except ClusterError as exc:
        print(f"etj: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
