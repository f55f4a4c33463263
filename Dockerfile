# syntax=docker/dockerfile:1
# The etj operator image: `etj operator run` (kopf) on a slim Python, as a non-root user, nothing else.
# Build from the repository root:  docker build -t ghcr.io/etj-dev/etj-operator:0.1.0 .
# Python packages come from pyproject.toml's pins (kopf, kubernetes, pydantic); the trainer's extras
# (torch, DALI) are not installed here.
# The base is pinned by tag, not by digest: no container registry was reachable where this file was written,
# so no digest could be looked up or verified, and none is made up. To pin one, resolve it and pass it:
#   --build-arg PYTHON_IMAGE=python:3.12.8-slim-bookworm@sha256:<digest>   (docs/install-eks.md, "Images")
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
# Only the operator and the contract it shares with the trainer: neither the trainer nor the test bed
# (testbed/src: the local control plane, process nodes, the demo) is copied, so the image has neither, and
# its `etj` has no `cluster`/`demo` commands (tests/chart/test_images.py checks the COPY lines).
COPY operator/src operator/src
COPY contract/src contract/src
# A virtual environment at the path it will have in the final image, so it can be copied as is.
RUN python -m venv /opt/etj \
    && /opt/etj/bin/pip install --no-cache-dir --disable-pip-version-check . \
    && /opt/etj/bin/etj --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="etj-operator" \
      org.opencontainers.image.description="ElasticTrainingJob operator" \
      org.opencontainers.image.source="https://github.com/etj-dev/etj" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/etj /opt/etj
# HOME on /tmp: the chart runs the container with a read-only root filesystem and an emptyDir at /tmp.
ENV PATH=/opt/etj/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# A passwd and group entry for the numeric user: a real kubelet runs the container as exactly this uid, and
# getpass.getuser() (kopf's peer identity, at operator start-up) raises KeyError for a uid
# without one. An entry the base already has is kept.
RUN (getent passwd 65532 >/dev/null || echo "etj:x:65532:65532:etj:/tmp:/usr/sbin/nologin" >> /etc/passwd) \
    && (getent group 65532 >/dev/null || echo "etj:x:65532:" >> /etc/group)
# Numeric user, matching the chart's podSecurityContext.runAsUser.
USER 65532:65532
# kopf /healthz and Prometheus /metrics (the chart's operator.livenessPort and metrics.port).
EXPOSE 8080 9090
ENTRYPOINT ["etj", "operator", "run"]
