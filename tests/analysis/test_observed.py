"""End to end: what the run observed decides, across the files of a project and into installed
libraries (issue 19, section 2). Each project under tests/data/projects/ plants patterns the
source read alone missed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.e2e  # runs real training scripts under perfdoctor

PROJECTS = REPO / "tests" / "data" / "projects"


def _findings(tmp_path: Path, script: Path, steps: int) -> list[dict]:
    out = tmp_path / "report.json"
    r = run_cli("run", str(script), "--steps", str(steps), "--out-dir", str(tmp_path / "run"), "--format", "json",
                "--output", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())["findings"]


def _at(findings: list[dict], rule: str) -> dict[tuple[str, int], dict]:
    return {(Path(f["locations"][0]["file"]).name, f["locations"][0]["line"]): f for f in findings if f["rule"] == rule}


def test_conv_nets_found_from_the_modules_the_run_called(tmp_path):
    """A library's ResNet built by its builder (no nn.Conv2d in the user's files for it) and a VGG of
    appended layers in another file: both are conv nets under autocast (PD016, PD023), the VGG
    counts its eight convolutions, and its biased convolutions feed BatchNorm (PD028) at the
    line that appends them."""
    project = PROJECTS / "convnets"
    train, models = (project / "train.py").read_text().splitlines(), (project / "models.py").read_text().splitlines()
    builder = next(i for i, t in enumerate(train, 1) if "tinyvision.tiny_resnet()" in t)
    append = next(i for i, t in enumerate(models, 1) if "layers.append(nn.Conv2d" in t)
    found = _findings(tmp_path, project / "train.py", 8)
    # one setting for the process: one PD016 naming both models, each model's count where it is first
    (pd016,) = [f for f in found if f["rule"] == "PD016"]
    at = [(Path(loc["file"]).name, loc["line"]) for loc in pd016["locations"]]
    assert sorted(at) == sorted([("train.py", builder), ("models.py", append)])
    assert f"({8 if at[0][0] == 'models.py' else 4} convolution layers)" in pd016["title"]
    pd023 = {(Path(loc["file"]).name, loc["line"]) for f in found if f["rule"] == "PD023" for loc in f["locations"]}
    assert pd023 == {("train.py", builder), ("models.py", append)}  # (one finding may list both)
    (pd028,) = _at(found, "PD028").values()
    assert (Path(pd028["locations"][0]["file"]).name, pd028["locations"][0]["line"]) == ("models.py", append)
    assert "8 layers built at this line" in pd028["title"] and "bias=False" in pd028["fix"]["after"]


def test_host_tensors_moved_every_step_found_at_the_factory_and_the_move(tmp_path):
    """A helper in another file returns torch.randint(...) that the loop moves, the model's forward
    moves torch.arange(...).expand_as(w), the loop moves torch.randn(...) with type_as: PD004 at
    each factory line with the move line beside it. A tensor drawn from a host generator is not
    flagged (device= cannot be given)."""
    project = PROJECTS / "host_tensors"

    def line(name: str, text: str) -> tuple[str, int]:
        lines = (project / name).read_text().splitlines()
        return name, next(i for i, t in enumerate(lines, 1) if text in t)

    found = [f for f in _findings(tmp_path, project / "train.py", 12) if f["rule"] == "PD004"]
    where = {tuple((Path(loc["file"]).name, loc["line"]) for loc in f["locations"]) for f in found}
    assert where == {
        (line("utils.py", "torch.randint"), line("train.py", "random_labels(8, 10).to")),
        (line("train.py", "type_as(imgs)"),),
        (line("models.py", "torch.arange"),),
    }


def test_a_loader_built_in_one_file_moved_by_a_helper_of_another(tmp_path):
    """The training loader (pinned) is built in data.py, iterated through a progress wrapper over
    enumerate() in train.py, and its batches moved by utils.to_device without non_blocking: PD017 at
    the helper's move line. The unpinned evaluation loader's batches go through the same helper on a
    few steps only: not a training loader, no PD003."""
    project = PROJECTS / "loaders"
    lines = (project / "utils.py").read_text().splitlines()
    move = next(i for i, t in enumerate(lines, 1) if "t.to(device)" in t)
    found = _findings(tmp_path, project / "train.py", 30)
    assert set(_at(found, "PD017")) == {("utils.py", move)}
    assert not _at(found, "PD003")
