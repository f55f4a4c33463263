"""Checkpoints in an S3-compatible object store (``checkpoint.uri: s3://bucket/prefix``).

A durable home for the shared copy without a PVC: losing every worker at once (a whole spot pool) then
costs the steps since the last shared checkpoint, not the job. Objects are written with one PUT each,
which S3 makes atomic (a reader sees the old object or the complete new one); the checkpoint's own
checksum (store.py) catches anything else, so the newest object that verifies wins, as on a volume.

The client is the MinIO SDK (``minio``; S3 protocol only, no botocore: botocore pins python-dateutil below
3, which the kubernetes client's current release excludes). Configuration is the usual AWS environment:

- ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (e.g. ``http://minio.storage:9000``); default AWS S3;
- credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), else the pod's IAM
  role (IRSA web identity or the instance profile);
- ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from etj_contract import env as etj_env

SCHEMES = etj_env.CHECKPOINT_URI_SCHEMES  # the CRD admits exactly these


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ends with "/"

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        u = urlparse(uri)
        if u.scheme not in SCHEMES or not u.netloc:
            raise ValueError(f"checkpoint URI must look like s3://bucket/prefix, not {uri!r}")
        prefix = u.path.strip("/")
        return cls(u.netloc, prefix + "/" if prefix else "")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def client_from_env(env: Mapping[str, str] | None = None) -> Any:
    """A MinIO client for the endpoint and credentials the AWS variables name."""
    from minio import Minio
    from minio.credentials import ChainedProvider, EnvAWSProvider, IamAwsProvider

    e = os.environ if env is None else env
    endpoint = e.get("AWS_ENDPOINT_URL_S3") or e.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
    u = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    region = e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or None
    return Minio(
        u.netloc,
        secure=u.scheme == "https",
        region=region,
        credentials=ChainedProvider([EnvAWSProvider(), IamAwsProvider()]),
    )


class ObjectDir:
    """A checkpoint "directory" under ``s3://bucket/prefix``: the few operations store.py needs."""

    def __init__(self, uri: str, client: Any = None) -> None:
        self.location = S3Location.parse(uri)
        self.client = client if client is not None else client_from_env()

    def __str__(self) -> str:
        return str(self.location)

    def _key(self, name: str) -> str:
        return self.location.prefix + name

    def write(self, name: str, data: bytes) -> None:
        self.client.put_object(self.location.bucket, self._key(name), io.BytesIO(data), len(data))

    def read(self, name: str) -> bytes:
        resp = self.client.get_object(self.location.bucket, self._key(name))
        try:
            return bytes(resp.read())
        finally:
            resp.close()
            resp.release_conn()

    def read_if_present(self, name: str) -> bytes | None:
        """``read``, or None for an object that is not there (pruned since a LIST): an answer, not a failure
        to reach the store."""
        from minio.error import S3Error

        try:
            return self.read(name)
        except S3Error as e:
            if e.code == "NoSuchKey":
                return None
            raise

    def names(self) -> list[str]:
        """Object names directly under the prefix."""
        objs = self.client.list_objects(self.location.bucket, prefix=self.location.prefix)
        return [o.object_name[len(self.location.prefix) :] for o in objs if not o.is_dir]

    def delete(self, name: str) -> None:
        self.client.remove_object(self.location.bucket, self._key(name))


PROBE_NAME = ".etj-preflight-probe"  # not a checkpoint name (store._NAME): LIST never offers it for a restore


def probe_problem(uri: str, env: Mapping[str, str] | None = None) -> str | None:
    """Can the job list and write ``uri``? One LIST, one PUT of a small probe object, its DELETE; the problem
    in words (endpoint and error), or None. Preflight runs it before training starts (agent/preflight.py):
    a job that cannot write its checkpoints should not train for an interval first to find out."""
    try:
        objects = ObjectDir(uri, client_from_env(env))
    except ValueError as e:
        return str(e)
    aws = os.environ if env is None else env
    endpoint = aws.get("AWS_ENDPOINT_URL_S3") or aws.get("AWS_ENDPOINT_URL") or "AWS S3"
    steps = (
        ("list", objects.names),
        ("write a probe object to", lambda: objects.write(PROBE_NAME, b"etj preflight probe\n")),
        ("delete the probe object from", lambda: objects.delete(PROBE_NAME)),
    )
    for verb, op in steps:
        try:
            op()
        except Exception as err:  # each step's failure is the answer
            return f"cannot {verb} {objects} at {endpoint}: {type(err).__name__}: {err}"
    return None
