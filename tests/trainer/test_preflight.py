"""Missing or bad input is refused before any process starts, naming its flag or variable (issue 27 item 5):
``etj-train local --nodes 1 --max-steps 3`` without ``--data`` used to start a store and an agent and fail
in the worker with ``ValueError: dataset_size must be positive``."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from etj_trainer import cli
from etj_trainer.agent import preflight, worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom-loop" / "train.py"
TINY = "etj_trainer.classifier.models:tiny_mlp"

CASES: dict[str, tuple[dict[str, str], list[tuple[str, str]]]] = {
    # name: (the job's ETJ_* settings, [(the variable refused, what its message says)])
    "a built-in data set and model": ({"ETJ_DATA": "digits-tensor", "ETJ_MODEL": TINY}, []),
    "no data": ({}, [("ETJ_DATA", "no data set named")]),
    "a data path that does not exist": (
        {"ETJ_DATA": "{tmp}/nowhere"},
        [("ETJ_DATA", "{tmp}/nowhere: no such file or directory")],
    ),
    "an unreadable data folder": ({"ETJ_DATA": "{tmp}/locked"}, [("ETJ_DATA", "not readable")]),
    "a data file that is not a .tar": ({"ETJ_DATA": "{tmp}/notes.txt"}, [("ETJ_DATA", "not a .tar")]),
    "a folder and a bad validation path": (
        {"ETJ_DATA": "{tmp}/good", "ETJ_VAL_DATA": "{tmp}/val-nowhere"},
        [("ETJ_VAL_DATA", "val-nowhere: no such file")],
    ),
    # issue 37 item 5: no samples at all used to pass and crash-loop on "dataset_size must be positive"
    "a folder tree with images": ({"ETJ_DATA": "{tmp}/good"}, []),
    "a parent folder with train/ and val/": ({"ETJ_DATA": "{tmp}/split", "ETJ_VAL_DATA": "{tmp}/split"}, []),
    "a tar with images": ({"ETJ_DATA": "{tmp}/good.tar"}, []),
    "empty class folders": (
        {"ETJ_DATA": "{tmp}/empty-classes"},
        [("ETJ_DATA", "{tmp}/empty-classes: no images (.jpg, .jpeg, .png) in its 2 class folders")],
    ),
    "an empty train split": (
        {"ETJ_DATA": "{tmp}/empty-split"},
        [("ETJ_DATA", "{tmp}/empty-split/train: no images")],
    ),
    "an empty validation split": (
        {"ETJ_DATA": "{tmp}/good", "ETJ_VAL_DATA": "{tmp}/empty-split"},
        [("ETJ_VAL_DATA", "{tmp}/empty-split/val: no images")],
    ),
    "a folder of non-images, no class folders": (
        {"ETJ_DATA": "{tmp}/flat"},
        [("ETJ_DATA", "{tmp}/flat: no class folders")],
    ),
    "class folders of non-images": (
        {"ETJ_DATA": "{tmp}/text-classes"},
        [("ETJ_DATA", "{tmp}/text-classes: no images (.jpg, .jpeg, .png) in its 1 class folders")],
    ),
    "an empty tar": ({"ETJ_DATA": "{tmp}/empty.tar"}, [("ETJ_DATA", "{tmp}/empty.tar: a tar with no image")]),
    "a tar of non-images": (
        {"ETJ_DATA": "{tmp}/text.tar"},
        [("ETJ_DATA", "{tmp}/text.tar: a tar with no image")],
    ),
    "a .tar that is not a tar": (
        {"ETJ_DATA": "{tmp}/fake.tar"},
        [("ETJ_DATA", "{tmp}/fake.tar: not a readable tar")],
    ),
    "synthetic data of a bad size": ({"ETJ_DATA": "synthetic-tensor:many"}, [("ETJ_DATA", "N must be")]),
    "a model module that does not import": (
        {"ETJ_DATA": "digits-tensor", "ETJ_MODEL": "no_such_pkg.models:net"},
        [("ETJ_MODEL", "module 'no_such_pkg.models' does not import (ModuleNotFoundError")],
    ),
    "a model module without the callable": (
        {"ETJ_DATA": "digits-tensor", "ETJ_MODEL": "etj_trainer.classifier.models:nope"},
        [("ETJ_MODEL", "has no callable 'nope'")],
    ),
    "no data and a bad model: both": (
        {"ETJ_MODEL": "no_such_pkg:net"},
        [("ETJ_DATA", "no data set named"), ("ETJ_MODEL", "does not import")],
    ),
    "a script: data and model are its own": ({"ETJ_SCRIPT": json.dumps([str(EXAMPLE)])}, []),
    "a script that does not exist": (
        {"ETJ_SCRIPT": json.dumps(["{tmp}/train.py"])},
        [("ETJ_SCRIPT", "{tmp}/train.py: no such file")],
    ),
    "a script module that does not exist": (
        {"ETJ_SCRIPT": json.dumps(["-m", "no_such_pkg.train"])},
        [("ETJ_SCRIPT", "-m no_such_pkg.train: no such module")],
    ),
}


@pytest.mark.parametrize("deep", [True, False], ids=["deep (etj-train local)", "shallow (etj-train worker)"])
@pytest.mark.parametrize("case", CASES)
def test_each_bad_input_is_named(case: str, deep: bool, tmp_path: Path) -> None:
    settings, expected = CASES[case]
    _make_data_sets(tmp_path)
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in settings.items()}
    if os.geteuid() == 0 and case == "an unreadable data folder":
        pytest.skip("root reads every folder")
    found = [(r.var.name, r.problem) for r in preflight.check(env, deep)]
    assert [name for name, _ in found] == [name for name, _ in expected], found
    for (_, problem), (_, says) in zip(found, expected, strict=True):
        assert says.replace("{tmp}", str(tmp_path)) in problem


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _make_data_sets(tmp: Path) -> None:
    """The data sets CASES name under ``{tmp}`` (preflight reads names, not pixels: stand-in bytes)."""
    (tmp / "locked").mkdir(mode=0o000)
    (tmp / "notes.txt").write_text("not data")
    files = {
        "good/cat/a.jpg": "jpeg",
        "good/dog/b.PNG": "png",
        "split/train/cat/a.jpg": "jpeg",
        "split/val/cat/b.jpeg": "jpeg",
        "empty-split/train/cat/README": "no image",
        "empty-split/val/cat/README": "no image",
        "flat/a.txt": "text",
        "text-classes/cat/a.txt": "text",
        "fake.tar": "not a tar",
    }
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    for d in ("empty-classes/cat", "empty-classes/dog"):
        (tmp / d).mkdir(parents=True)
    _tar(tmp / "good.tar", {"0.jpg": b"jpeg", "0.cls": b"3"})
    _tar(tmp / "empty.tar", {})
    _tar(tmp / "text.tar", {"0.txt": b"text", "0.cls": b"3"})


@pytest.fixture
def no_etj_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("ETJ_"):
            monkeypatch.delenv(k)


def test_local_without_data_names_the_flag_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_etj_env: None
) -> None:
    """The issue's command: refused with --data named, exit 2, and no store or agent started."""
    from etj_trainer.agent import local_launcher

    def started(*args: object, **kw: object) -> int:
        raise AssertionError("etj-train local started its processes")

    monkeypatch.setattr(local_launcher, "main", started)
    code = cli.main(["local", "--nodes", "1", "--max-steps", "3", "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert code == 2
    assert "etj-train local: --data: no data set named" in err and "--script PATH" in err
    assert not (tmp_path / "logs").exists()


def test_local_names_a_bad_model_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_etj_env: None
) -> None:
    from etj_trainer.agent import local_launcher

    monkeypatch.setattr(local_launcher, "main", lambda *a, **kw: 0)
    code = cli.main(["local", "--data", "digits-tensor", "--model", "no_such_pkg:net"])
    assert code == 2
    assert (
        "etj-train local: --model: no_such_pkg:net: module 'no_such_pkg' does not import"
        in capsys.readouterr().err
    )


def test_a_worker_refuses_before_its_agent_starts_and_reports_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_etj_env: None
) -> None:
    """A pod with a bad ETJ_DATA exits 1 at once (no crash loop), the line in its log and its progress doc."""
    reported: list[str] = []
    monkeypatch.setenv("ETJ_DATA", "/no/such/data")
    monkeypatch.setenv("ETJ_WORKER_ID", "worker-3")
    monkeypatch.setattr(worker, "report_error", lambda line: reported.append(line) or True)
    monkeypatch.setattr(worker, "run_agent", lambda cfg: pytest.fail("the agent started"))
    assert worker.main() == 1
    assert "etj-train worker: ETJ_DATA: /no/such/data: no such file or directory" in capsys.readouterr().err
    assert reported == [
        "worker-3: InputRefused: ETJ_DATA: /no/such/data: no such file or directory "
        "(nor one of digits, digits-tensor, fashion-mnist-tensor, synthetic-tensor[:N])"
    ]


def test_an_unknown_torchvision_name_is_refused_where_torchvision_may_be_imported() -> None:
    (refused,) = preflight.check({"ETJ_DATA": "digits-tensor", "ETJ_MODEL": "resnet5O"}, deep=True)
    assert (refused.var.name, refused.problem) == (
        "ETJ_MODEL",
        "resnet5O: not a torchvision model name, nor module:callable",
    )


def test_the_workers_check_imports_no_torch() -> None:
    """The agent imports torch only once its forkserver has started (agent/worker.py: both import at once,
    so a joiner is warm sooner); its input check must not import it first."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from etj_trainer.agent import preflight, worker\n"
        "env = {'ETJ_DATA': 'digits-tensor', 'ETJ_MODEL': 'etj_trainer.classifier.models:tiny_mlp'}\n"
        "assert preflight.check(env, deep=False) == []\n"
        "print(sorted(m for m in ('torch', 'numpy', 'torchvision') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
