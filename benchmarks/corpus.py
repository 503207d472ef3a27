"""Is perfdoctor right on real code? Runs it on the labelled corpus of public training scripts
(corpus/sources.toml) and scores its findings against the labels: recall and false findings per rule.

    python benchmarks/corpus.py [--only ID ...] [--steps N] [--bare] [--site DIR ...]
                                [--mirror DIR] [--work DIR] [--json PATH] [--line-slack N]
    python benchmarks/corpus.py --reanalyse --work DIR [--split dev] [--json PATH]   # an analysis change, scored
                                                                                     # on DIR's kept run folders

For each script: copy it (and the sibling files it needs) out of a snapshot of its repository at the
recorded commit into a scratch folder (`--work`, default /tmp/perfdoctor-corpus/<id>/), build its tiny
stand-in dataset (never a download), run `perfdoctor run SCRIPT --steps N --format json` there with a
timeout, and match the findings to the labels. A finding is a true positive when its rule and one of
its locations match a label (same file, the label's line or one of its `also` lines, +-`--line-slack`;
a label without a line matches any location), and it finds every label its locations match; every other
finding is a false finding (high and
medium ones counted apart, those hitting a `[[script.not]]` entry named). A label that is optional
counts neither as a miss nor, when matched, as a false finding. A script that times out, crashes or
cannot be prepared is recorded as such and the others go on.

With `--bare` the script also runs bare (plain `python SCRIPT ARGS`) and both runs go without
`--steps`, so that the wall times compare the same work: the ratio is perfdoctor's wall time over the
bare one, and a script that exits 0 bare but not under perfdoctor is reported as changed behaviour.

The snapshots are not in this repository: see corpus/README.md for how to get them. Scripts that
import torchvision or matplotlib need them importable: install them in the venv, or with
`pip install --target DIR` and pass `--site DIR` (put on PYTHONPATH for the runs).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import random
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO / "corpus" / "sources.toml"
TEST_SOURCES = REPO / "corpus" / "test.toml"
DEFAULT_MIRROR = Path(os.environ.get("PERFDOCTOR_CORPUS_MIRROR", "/work/.mirror"))
DEFAULT_WORK = Path("/tmp/perfdoctor-corpus")
SEVERE = ("high", "medium")


# ------------------------------------------------------------------------------------ snapshots


class MissingSnapshot(Exception):
    pass


def snapshot_dir(mirror: Path, repository: str, commit: str) -> Path:
    """The git directory holding `repository` at `commit`: the `fetch` tool's layout
    (MIRROR/owner+name/repo), a bare clone (MIRROR/owner/name.git) or a clone (MIRROR/owner/name)."""
    owner, name = repository.split("/")
    candidates = [
        mirror / f"{owner}+{name}" / "repo" / ".git",
        mirror / f"{owner}+{name}" / "repo",
        mirror / owner / f"{name}.git",
        mirror / owner / name / ".git",
        mirror / name / ".git",
    ]
    for git_dir in candidates:
        if git_dir.exists():
            ok = subprocess.run(
                [
                    "git",
                    f"--git-dir={git_dir}",
                    "cat-file",
                    "-e",
                    f"{commit}^{{commit}}",
                ],
                capture_output=True,
                check=False,
            )
            if ok.returncode == 0:
                return git_dir
            raise MissingSnapshot(
                f"{git_dir} does not hold commit {commit} of {repository}: fetch a newer snapshot "
                f"(fetch github:{repository}) or `git -C {git_dir.parent} fetch origin {commit}`"
            )
    raise MissingSnapshot(
        f"no snapshot of {repository} under {mirror}: fetch it with the fetch tool "
        f"(github:{repository}), or `git clone https://github.com/{repository} {mirror / owner / name}"
        f" && git -C {mirror / owner / name} checkout {commit}`"
    )


def materialise(git_dir: Path, commit: str, paths: list[str], dest: Path) -> None:
    """Copy `paths` (files or folders) of the repository at `commit` into `dest` (git archive)."""
    spec = [p.rstrip("/") for p in paths if p not in (".", "")]
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "--format=tar", commit, "--", *spec],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"git archive of {', '.join(spec) or '.'} failed: "
            f"{out.stderr.decode(errors='replace').strip()[-300:]} (a snapshot may lack its largest "
            "files: list the code files in `files` and build the data with a prepare step)"
        )
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")


def apply_edits(root: Path, script_path: str, edits: list[dict]) -> None:
    """Same-line substitutions (line numbers never move, so the labels still hold)."""
    for edit in edits:
        target = root / edit.get("file", script_path)
        lines = target.read_text().splitlines(keepends=True)
        i = edit["line"] - 1
        if edit["old"] not in lines[i]:
            raise RuntimeError(
                f"edit does not apply: {target.name}:{edit['line']} lacks {edit['old']!r}"
            )
        lines[i] = lines[i].replace(edit["old"], edit["new"], 1)
        target.write_text("".join(lines))


# ------------------------------------------------------------------------------------ stand-in data


def _words(n_chars: int, seed: int) -> str:
    """Deterministic pseudo-prose with capitals, punctuation and newlines (and "O God, O God!",
    which minGPT's chargpt samples from)."""
    rng = random.Random(seed)
    syllables = [
        "ka",
        "lo",
        "re",
        "mi",
        "tan",
        "so",
        "ver",
        "du",
        "pel",
        "or",
        "the",
        "and",
        "ing",
        "ght",
    ]
    vocab = [
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
        for _ in range(400)
    ]
    out, size = ["O God, O God!\n"], 14
    while size < n_chars:
        sentence = " ".join(rng.choice(vocab) for _ in range(rng.randint(4, 14)))
        line = (
            sentence[0].upper()
            + sentence[1:]
            + rng.choice([".", ",", ";", "!", "?", ":"])
            + "\n"
        )
        out.append(line)
        size += len(line)
    return "".join(out)[:n_chars]


def fake_mnist(
    root: Path, n_train: int = 2000, n_test: int = 500, name: str = "MNIST"
) -> None:
    """MNIST's raw idx files (uncompressed, as torchvision keeps them after a download) with random
    digits: torchvision.datasets.MNIST(root, download=True) finds them and downloads nothing.
    `name` is the dataset class's folder (FashionMNIST, KMNIST: the same file layout)."""
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = bytes(rng.getrandbits(8) for _ in range(n * 28 * 28))
        labels = bytes(rng.randrange(10) for _ in range(n))
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + images
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, n) + labels
        )


def nanogpt_char(root: Path, n_chars: int = 300_000) -> None:
    """What nanoGPT's data/shakespeare_char/prepare.py writes (train.bin, val.bin, meta.pkl), from
    generated text instead of the downloaded tiny-shakespeare."""
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    data = _words(n_chars, seed=1)
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    n = len(data)
    ids = np.array([stoi[c] for c in data], dtype=np.uint16)
    ids[: int(n * 0.9)].tofile(root / "train.bin")
    ids[int(n * 0.9) :].tofile(root / "val.bin")
    with open(root / "meta.pkl", "wb") as f:
        pickle.dump(
            {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f
        )


def write_png(path: Path, pixels) -> None:
    """An 8-bit grey (H, W) or RGB (H, W, 3) uint8 array as a PNG file, with zlib only (the
    benchmark's own Python need not have PIL). Image readers go by the content, not the name, so
    the same bytes stand in for a .jpg or a .gif as well."""
    import zlib

    height, width = pixels.shape[:2]
    color = 2 if pixels.ndim == 3 else 0
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + tag
            + data
            + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def fake_images(root: Path, step: dict) -> None:
    """`n` small random images per class (or `n` in all without `classes`). `name` is a format
    string with {i} (the index) and optionally {c} (the class): with {c} the files of every class
    go into `dir` itself (Abyssinian_12.jpg), without it into `dir`/<class>/ (torchvision's
    ImageFolder layout). `mode`: RGB (default), L (grey) or mask (one black-and-white disc: a
    two-valued segmentation mask). Seeded, so reruns are identical."""
    import numpy as np

    rng = np.random.default_rng(0)
    width, height = step.get("size", [64, 64])
    mode = step.get("mode", "RGB")
    classes = step.get("classes") or [None]
    for c in classes:
        folder = root / step["dir"]
        if c is not None and "{c}" not in step["name"]:
            folder = folder / c
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(step["n"]):
            target = folder / step["name"].format(i=i, c=c)
            if mode == "mask":
                yy, xx = np.mgrid[0:height, 0:width]
                cy, cx = rng.integers(0, height), rng.integers(0, width)
                r = rng.integers(min(width, height) // 6, min(width, height) // 2)
                disc = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
                write_png(target, disc.astype(np.uint8) * 255)
            elif mode == "L":
                write_png(target, rng.integers(0, 256, (height, width), dtype=np.uint8))
            else:
                write_png(target, rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def prepare(
    root: Path, steps: list[dict], env: dict[str, str], cwd: Path, timeout: float
) -> None:
    for step in steps:
        kind = step["kind"]
        if kind == "mnist":
            fake_mnist(root / step["root"], name=step.get("name", "MNIST"))
        elif kind == "images":
            fake_images(root, step)
        elif kind == "nanogpt_char":
            nanogpt_char(root / step["root"])
        elif kind == "text":
            target = root / step["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_words(step.get("chars", 100_000), seed=2))
        elif kind == "command":
            argv = [sys.executable if a == "{python}" else a for a in step["argv"]]
            subprocess.run(
                argv, cwd=cwd, env=env, check=True, capture_output=True, timeout=timeout
            )
        else:
            raise RuntimeError(f"unknown prepare kind {kind!r}")


# ------------------------------------------------------------------------------------ runs


def run_timed(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float, log: Path
) -> tuple[int | None, float]:
    """Run in its own process group; on timeout kill the group (DataLoader workers included).
    Returns (exit code or None on timeout, wall seconds)."""
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    return code, time.perf_counter() - t0


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------------------------ scoring


@dataclass
class Match:
    tp: list[dict] = field(default_factory=list)  # {label, finding}
    fp: list[dict] = field(default_factory=list)  # {finding, not_note}
    missed: list[dict] = field(default_factory=list)  # labels
    optional_hit: list[dict] = field(default_factory=list)


def _loc_matches(loc: dict, file: str, lines: list[int] | None, slack: int) -> bool:
    if not str(loc.get("file") or "").replace("\\", "/").endswith("/" + file):
        return False
    if lines is None:
        return True
    line = loc.get("line")
    return isinstance(line, int) and any(abs(line - want) <= slack for want in lines)


def _hits(finding: dict, entry: dict, default_file: str, slack: int) -> bool:
    if finding.get("rule") != entry["rule"]:
        return False
    lines = None if "line" not in entry else [entry["line"], *entry.get("also", [])]
    locations = finding.get("locations") or []
    if lines is None and (not locations or "file" not in entry):
        return True  # a label on the whole script ("the model trains in fp32"): wherever it is said
    file = entry.get("file", default_file)
    return any(_loc_matches(loc, file, lines, slack) for loc in locations)


def score(findings: list[dict], script: dict, slack: int) -> Match:
    labels = script.get("label", [])
    nots = script.get("not", [])
    m = Match()
    used: set[int] = set()
    for finding in findings:
        # a finding that lists several labelled lines (PD008's reads of one step) found each of them
        hits = [i for i, lab in enumerate(labels) if _hits(finding, lab, script["path"], slack)]
        for hit in hits:
            (m.optional_hit if labels[hit].get("optional") else m.tp).append(
                {"label": labels[hit], "finding": _brief(finding)}
            )
            used.add(hit)
        if hits:
            continue
        note = next((n for n in nots if _hits(finding, n, script["path"], slack)), None)
        m.fp.append({"finding": _brief(finding), "not": note["why"] if note else None})
    m.missed = [
        lab for i, lab in enumerate(labels) if i not in used and not lab.get("optional")
    ]
    # A label hit by several findings counts once; keep only the first finding per label in tp.
    seen: set[int] = set()
    tp = []
    for entry in m.tp:
        key = id(entry["label"])
        if key not in seen:
            seen.add(key)
            tp.append(entry)
    m.tp = tp
    return m


def _brief(finding: dict) -> dict:
    locs = finding.get("locations") or []
    return {
        "rule": finding.get("rule"),
        "severity": finding.get("severity"),
        "title": finding.get("title"),
        "confidence": finding.get("confidence"),
        "locations": [f"{Path(str(l.get('file'))).name}:{l.get('line')}" for l in locs],
    }


# ------------------------------------------------------------------------------------ one script


def script_env(script: dict, root: Path, site: list[Path]) -> dict[str, str]:
    """The environment a corpus script runs in, its copy at `root` (benchmarks/verify_savings.py too)."""
    env = dict(os.environ)
    pythonpath = [str(root / p) for p in script.get("pythonpath", [])] + [
        str(p) for p in site
    ]
    pythonpath += [str(REPO)]  # perfdoctor itself, from this checkout
    if env.get("PYTHONPATH"):
        pythonpath.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({k: str(v) for k, v in script.get("env", {}).items()})
    env["MPLBACKEND"] = "Agg"
    return env


def run_script(script: dict, repos: dict, args: argparse.Namespace) -> dict:
    sid = script["id"]
    repo = repos[script["repo"]]
    result: dict = {
        "id": sid,
        "repository": repo["repository"],
        "commit": repo["commit"],
        "path": script["path"],
        "cuda": script.get("cuda"),
        "labels": len(script.get("label", [])),
    }
    try:
        git_dir = snapshot_dir(args.mirror, repo["repository"], repo["commit"])
    except MissingSnapshot as e:
        return {**result, "status": "no-snapshot", "error": str(e)}

    work = args.work / sid
    if args.reanalyse:
        return reanalyse(script, result, work, args)
    shutil.rmtree(work, ignore_errors=True)
    root = work / "repo"
    root.mkdir(parents=True)
    script_dir = str(Path(script["path"]).parent)
    files = script.get("files", [script_dir if script_dir != "." else script["path"]])
    cwd = root / script.get("cwd", script_dir)
    env = script_env(script, root, args.site)

    try:
        materialise(git_dir, repo["commit"], files, root)
        apply_edits(root, script["path"], script.get("edits", []))
        cwd.mkdir(parents=True, exist_ok=True)
        for module in script.get("requires", []):
            probe = subprocess.run(
                [sys.executable, "-c", f"import {module}"],
                env=env,
                capture_output=True,
                check=False,
            )
            if probe.returncode != 0:
                return {
                    **result,
                    "status": "missing-module",
                    "error": f"cannot import {module} (see --site)",
                }
        prepare(
            root,
            script.get("prepare", []),
            env,
            cwd,
            script.get("timeout", args.timeout),
        )
    except (
        OSError,
        ValueError,
        RuntimeError,
        subprocess.SubprocessError,
        tarfile.TarError,
    ) as e:
        # one script's setup failing must not stop the others
        return {
            **result,
            "status": "prepare-failed",
            "error": f"{type(e).__name__}: {e}",
        }

    if args.prepare_only:
        return {**result, "status": "prepared"}
    script_file = root / script["path"]
    script_args = [str(a) for a in script.get("args", [])]
    timeout = args.timeout or script.get("timeout", 300)
    steps = args.steps or script.get("steps")
    report = work / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "perfdoctor",
        "run",
        str(script_file),
        "--format",
        "json",
        "--output",
        str(report),
        "--out-dir",
        str(work / "run"),
    ]
    if steps and not args.bare:
        cmd += ["--steps", str(steps)]
    cmd += ["--", *script_args]
    code, wall = run_timed(cmd, cwd, env, timeout, work / "perfdoctor.log")
    result.update({"command": " ".join(cmd), "exit": code, "wall_s": round(wall, 2)})

    if args.bare:
        # A fresh copy of the data and outputs is not needed: the scripts here overwrite their outputs.
        bcode, bwall = run_timed(
            [sys.executable, str(script_file), *script_args],
            cwd,
            env,
            timeout,
            work / "bare.log",
        )
        result.update({"bare_exit": bcode, "bare_wall_s": round(bwall, 2)})
        if bcode is not None and code is not None and bwall > 0:
            result["ratio"] = round(wall / bwall, 2)
        if bcode == 0 and code not in (0, 1):
            result["changed_behaviour"] = f"exit {bcode} bare, {code} under perfdoctor"

    if code is None:
        result.update(
            {
                "status": "timeout",
                "error": f"no result within {timeout:.0f} s",
                "log_tail": tail(work / "perfdoctor.log"),
            }
        )
        if not report.exists():
            return result
    if not report.exists():
        return {
            **result,
            "status": "crashed",
            "error": f"perfdoctor exit {code}, no report",
            "log_tail": tail(work / "perfdoctor.log"),
        }
    return scored(script, result, report, code, work, args)


def reanalyse(script: dict, result: dict, work: Path, args: argparse.Namespace) -> dict:
    """`--reanalyse`: the script's kept run folder (WORK/ID/run, from an earlier scoring with the same --work)
    judged again by this perfdoctor (`perfdoctor report RUN`) and scored: what a change to the analysis
    (facts, rules) does, in seconds a script, without running anything. A change to the capture needs a run."""
    run_dir = work / "run"
    if not (run_dir / "meta.json").is_file():
        return {**result, "status": "no-run-folder", "error": f"{run_dir} has no run (score with this --work first)"}
    report = work / "report.reanalysed.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "perfdoctor", "report", str(run_dir), "--format", "json", "--output", str(report)]
    # perfdoctor from this checkout, in the environment a scoring run had (script_env)
    code, wall = run_timed(cmd, work, script_env(script, work / "repo", []), args.timeout or 300, work / "reanalyse.log")
    result.update({"command": " ".join(cmd), "exit": code, "wall_s": round(wall, 2)})
    if not report.exists():
        return {**result, "status": "crashed", "error": f"perfdoctor report exit {code}, no report",
                "log_tail": tail(work / "reanalyse.log")}
    return scored(script, result, report, 0 if code in (0, 1) else code, work, args)


def scored(script: dict, result: dict, report: Path, code: int | None, work: Path, args: argparse.Namespace) -> dict:
    """The run's report matched against the script's labels."""
    try:
        data = json.loads(report.read_text())
    except ValueError as e:
        return {**result, "status": "crashed", "error": f"unreadable report: {e}"}
    run = data.get("run") or {}
    exit_info = run.get("exit") or {}
    result.setdefault("status", "ok" if code in (0, 1) else "script-failed")
    result.update(
        {
            "script_exit": exit_info,
            "steps_observed": run.get("steps_observed"),
            "steps_profiled": run.get("steps_profiled"),
            "notes": data.get("notes"),
        }
    )
    if result["status"] == "script-failed":
        result["log_tail"] = tail(work / "perfdoctor.log")
    m = score(data.get("findings") or [], script, args.line_slack)
    result.update(
        {
            "findings": [_brief(f) for f in data.get("findings") or []],
            "tp": [
                {
                    "rule": e["label"]["rule"],
                    "line": e["label"].get("line"),
                    "gpu_only": bool(e["label"].get("gpu_only")),
                    "finding": e["finding"],
                }
                for e in m.tp
            ],
            "optional_hit": [
                {
                    "rule": e["label"]["rule"],
                    "line": e["label"].get("line"),
                    "finding": e["finding"],
                }
                for e in m.optional_hit
            ],
            "fp": m.fp,
            "missed": [
                {
                    "rule": lab["rule"],
                    "line": lab.get("line"),
                    "gpu_only": bool(lab.get("gpu_only")),
                    "why": lab["why"],
                }
                for lab in m.missed
            ],
        }
    )
    return result


# ------------------------------------------------------------------------------------ totals


def totals(results: list[dict], scripts: dict[str, dict]) -> dict:
    per_rule: dict[str, dict] = {}

    def row(rule: str) -> dict:
        return per_rule.setdefault(
            rule,
            {
                "labels": 0,
                "gpu_only": 0,
                "found": 0,
                "missed": 0,
                "fp_severe": 0,
                "fp_low": 0,
                "optional": 0,
                "cpu_labels": 0,
                "cpu_found": 0,
            },
        )

    scored = [r for r in results if "tp" in r]
    for r in scored:
        for lab in scripts[r["id"]].get("label", []):
            x = row(lab["rule"])
            if lab.get("optional"):
                x["optional"] += 1
            else:
                x["labels"] += 1
                x["gpu_only"] += bool(lab.get("gpu_only"))
                x["cpu_labels"] += not lab.get("gpu_only")
        for e in r["tp"]:
            row(e["rule"])["found"] += 1
            row(e["rule"])["cpu_found"] += not e["gpu_only"]
        for lab in r["missed"]:
            row(lab["rule"])["missed"] += 1
        for e in r["fp"]:
            f = e["finding"]
            row(f["rule"])["fp_severe" if f["severity"] in SEVERE else "fp_low"] += 1
    for x in per_rule.values():
        x["recall"] = round(x["found"] / x["labels"], 3) if x["labels"] else None
        x["recall_cpu"] = (
            round(x["cpu_found"] / x["cpu_labels"], 3) if x["cpu_labels"] else None
        )
    labels = sum(x["labels"] for x in per_rule.values())
    found = sum(x["found"] for x in per_rule.values())
    cpu_labels = sum(
        1
        for r in scored
        for lab in scripts[r["id"]].get("label", [])
        if not lab.get("optional") and not lab.get("gpu_only")
    )
    cpu_found = sum(1 for r in scored for e in r["tp"] if not e["gpu_only"])
    return {
        "scripts": len(results),
        "scored": len(scored),
        "failed": {
            r["id"]: r["status"]
            for r in results
            if r["status"] not in ("ok", "prepared")
        },
        "labels": labels,
        "found": found,
        "recall": round(found / labels, 3) if labels else None,
        "recall_gpu_only": round((found - cpu_found) / (labels - cpu_labels), 3)
        if labels - cpu_labels
        else None,
        "recall_measurable": round(cpu_found / cpu_labels, 3) if cpu_labels else None,
        "false_findings": sum(len(r["fp"]) for r in scored),
        "false_findings_severe": sum(
            1 for r in scored for e in r["fp"] if e["finding"]["severity"] in SEVERE
        ),
        "changed_behaviour": {
            r["id"]: r["changed_behaviour"]
            for r in results
            if r.get("changed_behaviour")
        },
        "per_rule": dict(sorted(per_rule.items())),
    }


def _pct(v: float | None) -> str:
    return f"{v:.0%}" if v is not None else "-"


def print_tables(
    results: list[dict], total: dict, half: str, details: bool = True
) -> None:
    print(f"\n======== {half} half: {len(results)} scripts")
    print(
        f"\n{'script':36} {'status':14} {'exit':>4} {'wall':>7} {'find':>4} {'tp':>3} {'fp':>3} {'miss':>4}"
    )
    for r in results:
        n = {
            k: len(r[k]) if k in r else "-" for k in ("findings", "tp", "fp", "missed")
        }
        wall = f"{r['wall_s']:.1f}" if "wall_s" in r else "-"
        print(
            f"{r['id']:36} {r['status']:14} {r.get('exit', '-')!s:>4} {wall:>7} {n['findings']:>4} "
            f"{n['tp']:>3} {n['fp']:>3} {n['missed']:>4}"
        )
        if not details:
            continue
        for e in r.get("fp", []):
            f = e["finding"]
            note = f"  (labelled wrong: {e['not']})" if e["not"] else ""
            print(
                f"    false  {f['rule']} {f['severity']:6} {', '.join(f['locations']) or '-'}  {f['title']}{note}"
            )
        for lab in r.get("missed", []):
            print(
                f"    missed {lab['rule']} line {lab['line'] or '-'}{' (gpu-only)' if lab['gpu_only'] else ''}: {lab['why']}"
            )
        if r.get("error"):
            print(f"    {r['error']}")
    print(
        f"\n{'rule':6} {'labels':>6} {'gpu':>4} {'found':>5} {'recall':>6} {'cpu':>4} {'found':>5} "
        f"{'recall':>6} {'missed':>6} {'fp h/m':>6} {'fp low':>6} {'opt':>4}"
    )
    for rule, x in total["per_rule"].items():
        print(
            f"{rule:6} {x['labels']:>6} {x['gpu_only']:>4} {x['found']:>5} {_pct(x['recall']):>6} "
            f"{x['cpu_labels']:>4} {x['cpu_found']:>5} {_pct(x['recall_cpu']):>6} {x['missed']:>6} "
            f"{x['fp_severe']:>6} {x['fp_low']:>6} {x['optional']:>4}"
        )
    print(
        f"\n{half} half: {total['scored']}/{total['scripts']} scripts scored; {total['found']}/{total['labels']} labelled problems "
        f"found ({_pct(total['recall'])}; measurable on this machine {_pct(total['recall_measurable'])}, "
        f"GPU-only {_pct(total['recall_gpu_only'])}); {total['false_findings']} false findings, "
        f"{total['false_findings_severe']} of them high/medium"
    )
    if total["failed"]:
        print(
            "not scored or failed: "
            + ", ".join(f"{k} ({v})" for k, v in total["failed"].items())
        )
    if total["changed_behaviour"]:
        print(
            "changed behaviour: "
            + ", ".join(f"{k} ({v})" for k, v in total["changed_behaviour"].items())
        )


def load_corpus() -> tuple[dict, list[dict]]:
    """The repositories and scripts of both halves: sources.toml (the development half, and every
    repository) and test.toml (the frozen test half, kept in its own file so that whoever tunes
    rules on the development half does not read its labels by accident). Every script says its
    half (`split`); a script in the wrong file is an error."""
    spec = tomllib.loads(SOURCES.read_text())
    repos, scripts = spec["repos"], list(spec["script"])
    for s in scripts:
        s.setdefault("split", "dev")
    if TEST_SOURCES.exists():
        test = tomllib.loads(TEST_SOURCES.read_text())
        repos = {**repos, **test.get("repos", {})}
        scripts += test.get("script", [])
    for s in scripts:
        want = "test" if s in scripts[len(spec["script"]) :] else "dev"
        if s.get("split") != want:
            sys.exit(f"{s['id']}: split = {s.get('split')!r} in the {want} half's file")
        if s["repo"] not in repos:
            sys.exit(f"{s['id']}: unknown repo {s['repo']!r}")
    ids = [s["id"] for s in scripts]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        sys.exit(f"duplicate script ids: {', '.join(dupes)}")
    return repos, scripts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="ID",
        help="run only this script (repeatable)",
    )
    ap.add_argument("--steps", type=int, help="override every script's --steps")
    ap.add_argument(
        "--timeout", type=float, help="override every script's timeout (seconds)"
    )
    ap.add_argument(
        "--bare",
        action="store_true",
        help="also run each script bare; both runs without --steps",
    )
    ap.add_argument(
        "--site",
        action="append",
        type=Path,
        default=[],
        help="extra folder on PYTHONPATH (repeatable)",
    )
    ap.add_argument(
        "--mirror",
        type=Path,
        default=DEFAULT_MIRROR,
        help=f"snapshots folder (default {DEFAULT_MIRROR})",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=DEFAULT_WORK,
        help=f"scratch folder (default {DEFAULT_WORK})",
    )
    ap.add_argument(
        "--json", type=Path, help="write the results here (default WORK/results.json)"
    )
    ap.add_argument(
        "--line-slack",
        type=int,
        default=0,
        help="accept a finding this many lines off a label",
    )
    ap.add_argument(
        "--reanalyse",
        action="store_true",
        help="judge each script's kept run folder under --work again (perfdoctor report) and score it: "
        "an analysis change in seconds a script, nothing run",
    )
    ap.add_argument(
        "--prepare-only",
        action="store_true",
        help="materialise, edit and prepare each script, run nothing",
    )
    ap.add_argument(
        "--split",
        choices=("dev", "test", "all"),
        default="all",
        help="run only the development or the frozen test half (default: both, scored apart)",
    )
    ap.add_argument(
        "--show-test",
        action="store_true",
        help="print the test half's labels and per-script misses (for the final report only: "
        "whoever changes rules must not look at them)",
    )
    ap.add_argument(
        "--list",
        action="store_true",
        help="list the scripts and their label counts, run nothing",
    )
    args = ap.parse_args()

    repos, scripts = load_corpus()
    by_id = {s["id"]: s for s in scripts}
    unknown = [i for i in args.only if i not in by_id]
    if unknown:
        sys.exit(f"unknown script id(s): {', '.join(unknown)}; --list shows them")
    chosen = [by_id[i] for i in args.only] if args.only else scripts
    if args.split != "all":
        chosen = [s for s in chosen if s["split"] == args.split]
    if args.list:
        for s in chosen:
            if s["split"] == "test" and not args.show_test:
                print(f"{s['id']:36} test half: labels not shown (--show-test)")
                continue
            labs = s.get("label", [])
            rules = ", ".join(sorted({lab["rule"] for lab in labs}))
            print(
                f"{s['id']:36} {len(labs):>2} labels ({sum(1 for lab in labs if lab.get('optional'))} optional) "
                f"{len(s.get('not', [])):>2} not  {rules}"
            )
        return 0

    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for s in chosen:
        print(f"== {s['id']}", flush=True)
        r = run_script(s, repos, args)
        print(
            f"   {r['status']}"
            + (f" in {r['wall_s']} s" if "wall_s" in r else "")
            + (f": {r['error']}" if r.get("error") else ""),
            flush=True,
        )
        results.append(r)
    halves = {}
    for half in ("dev", "test"):
        part = [r for r in results if by_id[r["id"]]["split"] == half]
        if part:
            halves[half] = totals(part, by_id)
            print_tables(
                part, halves[half], half, details=half == "dev" or args.show_test
            )
    out = args.json or args.work / "results.json"
    out.write_text(json.dumps({"totals": halves, "results": results}, indent=2) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
