"""What a process-backed pod's container runs with: its environment, with the pod's directories in place
of volumes (mounts cannot be made without root), and a short TMPDIR. proclet/pod.py's runner calls it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from etj_testbed.localcluster.proclet.env import DataLookup, container_env
from etj_testbed.localcluster.proclet.proc import MARK_POD, MARK_ROOT, env_name

JSON = dict[str, Any]
HOST_IP = "127.0.0.1"


def container_environment(
    pod: JSON,
    container: JSON,
    ip: str,
    pod_dir: Path,
    root: Path,
    base_env: dict[str, str],
    lookup: DataLookup,
) -> dict[str, str]:
    """The container's env: the harness's base, the container's own (refs resolved), the pod's paths."""
    uid = str(pod["metadata"]["uid"])
    own = container_env(pod, container, pod_ip=ip, host_ip=HOST_IP, lookup=lookup)
    env = {**base_env, "HOSTNAME": pod["metadata"]["name"], **own}
    env.setdefault("ETJ_POD_IP", ip)
    env["ETJ_SCRATCH_DIR"] = str(pod_dir / "scratch")
    # emptyDir volumes become per-pod directories; mounts cannot be made without root, so the path is
    # published instead, and an emptyDir mounted at /tmp becomes TMPDIR.
    empty = {v["name"] for v in pod["spec"].get("volumes") or [] if "emptyDir" in v}
    for volume in sorted(empty):
        path = pod_dir / "volumes" / volume
        path.mkdir(parents=True, exist_ok=True)
        env[f"ETJ_VOLUME_{env_name(volume)}"] = str(path)
    for mount in container.get("volumeMounts") or []:
        if mount.get("name") in empty and mount.get("mountPath") == "/tmp":
            env["TMPDIR"] = str(short_tmp(uid, pod_dir / "volumes" / mount["name"]))
    env[MARK_ROOT] = str(root)
    env[MARK_POD] = uid
    return env


def short_tmp(uid: str, target: Path) -> Path:
    """A short path to `target`: Unix sockets made under TMPDIR (multiprocessing's forkserver, torch)
    fail with "AF_UNIX path too long" beyond 107 bytes, which a pod directory easily reaches."""
    link = tmp_link(uid)
    if not link.is_symlink():
        link.symlink_to(target, target_is_directory=True)
    return link


def tmp_link(uid: str) -> Path:
    """Where the pod's short TMPDIR link lives (removed with the pod)."""
    return Path(tempfile.gettempdir()) / f"etjpod-{uid[:13]}"
