"""The kind path's cached steps from an empty cache (issue 38).

Every machine that ran the kind path had the bookworm base cached, so a cold machine's failure went unseen:
mmdebstrap wrote a directory where docker import wanted a tar, and `make demo-kind` stopped after 23 s.
Here the base step runs with an empty cache directory (ETJ_CACHE_DIR) and an image name Docker does not
have (ETJ_BASE_IMAGE), so nothing cached can hide the cold path. Runs in `make test` where Docker is
installed (about a minute: mmdebstrap fetches some 90 Debian packages), skipped elsewhere with the reason.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.kind.kindbed import KIND_SH

pytestmark = pytest.mark.kind


def test_the_debian_base_image_is_made_from_an_empty_cache(tmp_path: Path) -> None:
    image = f"etj.local/debian:cold-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ETJ_CACHE_DIR": str(tmp_path / "cache"), "ETJ_BASE_IMAGE": image}
    try:
        made = subprocess.run([str(KIND_SH), "base"], env=env, capture_output=True, text=True, timeout=1200)
        assert made.returncode == 0, made.stderr[-4000:]
        assert made.stdout.strip().splitlines()[-1] == image
        assert "mmdebstrap" in made.stderr, made.stderr  # it ran cold, not from a cache
        cached = tmp_path / "cache" / "kind" / "debian-bookworm-minbase.tar"
        assert cached.is_file() and cached.stat().st_size > 0, cached
        out = subprocess.run(
            ["docker", "run", "--rm", "--network=none", image, "cat", "/etc/debian_version"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and out.stdout.strip().startswith("12."), (out.stdout, out.stderr)
        # Warm: the image is there, nothing is fetched again.
        again = subprocess.run([str(KIND_SH), "base"], env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and "mmdebstrap" not in again.stderr, again.stderr
    finally:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
