"""benchmarks/corpus.py: the labelled corpus's two halves and its stand-in data (no script runs here)."""

import importlib.util
import struct
import sys
import zlib
from pathlib import Path

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("corpus_bench", REPO / "benchmarks" / "corpus.py")
assert _spec and _spec.loader
corpus = importlib.util.module_from_spec(_spec)
sys.modules["corpus_bench"] = corpus  # dataclasses look their module up there
_spec.loader.exec_module(corpus)

RULE_IDS = {p.name.split("-")[0] for p in (REPO / "rules").glob("PD*.toml")}


def test_halves_are_split_by_repository_and_name_known_rules():
    repos, scripts = corpus.load_corpus()
    halves: dict[str, set[str]] = {"dev": set(), "test": set()}
    for s in scripts:
        halves[s["split"]].add(s["repo"])
        for entry in s.get("label", []) + s.get("not", []):
            assert entry["rule"] in RULE_IDS, (s["id"], entry["rule"])
        assert s["repo"] in repos
    assert not halves["dev"] & halves["test"], "a repository has scripts in both halves"
    assert sum(s["split"] == "test" for s in scripts) >= 22
    assert len(scripts) >= 80


def test_test_half_lives_in_its_own_file():
    spec = corpus.tomllib.loads(corpus.SOURCES.read_text())
    assert all(s.get("split", "dev") == "dev" for s in spec["script"])
    test = corpus.tomllib.loads(corpus.TEST_SOURCES.read_text())
    assert test["script"] and all(s["split"] == "test" for s in test["script"])


def _png_size_and_pixels(path: Path) -> tuple[int, int, int, bytes]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, _depth, color = struct.unpack(">IIBB", data[16:26])
    idat = data.index(b"IDAT")
    (length,) = struct.unpack(">I", data[idat - 4 : idat])
    return width, height, color, zlib.decompress(data[idat + 4 : idat + 4 + length])


def test_fake_images_writes_class_folders_and_two_valued_masks(tmp_path):
    corpus.fake_images(tmp_path, {"dir": "train", "n": 2, "size": [12, 8], "name": "{i}.jpg", "classes": ["a", "b"]})
    corpus.fake_images(tmp_path, {"dir": "pets", "n": 1, "size": [12, 8], "name": "{c}_{i}.jpg", "classes": ["cat"]})
    corpus.fake_images(tmp_path, {"dir": "masks", "n": 1, "size": [12, 8], "name": "{i}_mask.gif", "mode": "mask"})
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*")) == [
        "masks/0_mask.gif", "pets/cat_0.jpg", "train/a/0.jpg", "train/a/1.jpg", "train/b/0.jpg", "train/b/1.jpg",
    ]
    width, height, color, raw = _png_size_and_pixels(tmp_path / "train/a/0.jpg")
    assert (width, height, color, len(raw)) == (12, 8, 2, 8 * (1 + 12 * 3))
    width, height, color, raw = _png_size_and_pixels(tmp_path / "masks/0_mask.gif")
    rows = [raw[y * 13 + 1 : (y + 1) * 13] for y in range(8)]
    assert color == 0 and set(b"".join(rows)) <= {0, 255}


def test_totals_count_cpu_visible_labels_per_rule():
    script = {"id": "s", "split": "test", "label": [
        {"rule": "PD008", "gpu_only": False, "why": ""},
        {"rule": "PD008", "gpu_only": True, "why": ""},
        {"rule": "PD003", "optional": True, "why": ""},
    ]}
    result = {"id": "s", "status": "ok", "tp": [{"rule": "PD008", "gpu_only": False}], "fp": [],
              "missed": [{"rule": "PD008", "gpu_only": True}]}
    row = corpus.totals([result], {"s": script})["per_rule"]["PD008"]
    assert (row["labels"], row["cpu_labels"], row["found"], row["cpu_found"], row["recall_cpu"]) == (2, 1, 1, 1, 1.0)


def test_a_label_on_the_whole_script_matches_its_rule_in_any_file():
    """isic-unet's "a 34M-parameter U-Net in fp32 on CUDA" has no line and no file: PD007 said at
    solver.py (where the model runs; the script is main.py) is that label, not a false finding."""
    finding = {"rule": "PD007", "locations": [{"file": "/x/repo/solver.py", "line": 147}]}
    script = {"path": "main.py", "label": [{"rule": "PD007"}]}
    m = corpus.score([finding], script, 0)
    assert len(m.tp) == 1 and not m.fp and not m.missed
    pinned = {"path": "main.py", "label": [{"rule": "PD007", "file": "main.py"}]}  # a file named: that file
    m = corpus.score([finding], pinned, 0)
    assert not m.tp and len(m.fp) == 1


def test_a_finding_at_several_labelled_lines_finds_each_label():
    """ncrfpp-lstmcrf labels `.cpu()` at main.py:49 and `.item()` at main.py:417 apart; perfdoctor's one
    PD008 finding lists both lines: both labels are found, and the finding is no false one."""
    finding = {"rule": "PD008", "locations": [{"file": "/x/repo/main.py", "line": 49},
                                              {"file": "/x/repo/main.py", "line": 417}]}
    script = {"path": "main.py", "label": [{"rule": "PD008", "line": 417}, {"rule": "PD008", "line": 49},
                                           {"rule": "PD008", "line": 104, "file": "wordsequence.py"}]}
    m = corpus.score([finding], script, 0)
    assert sorted(t["label"]["line"] for t in m.tp) == [49, 417] and not m.fp
    assert [lab["line"] for lab in m.missed] == [104]
