"""Record the golden inputs and outputs of tests/report/test_golden.py.

    python tests/golden/record.py runs      # run every sample once under `perfdoctor run`, keep the run folders
    python tests/golden/record.py reports   # (re)write the expected report of every golden input

The run folders are recorded once and kept: a run's timings differ every time, so the golden test
re-analyses the recorded folders (`perfdoctor report RUN_DIR`) and the real traces in tests/data, whose
reports must not change unless a change means them to. Paths under the repository are stored as
`@REPO@` and the run folder's own path as `@RUN@`, so the files hold on any checkout.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUNS = HERE / "runs"
EXPECTED = HERE / "expected"
TRACES = REPO / "tests" / "data" / "traces"
# every sample that plants a problem, its twin where the twin is interesting, and the odd shapes
SAMPLES = ["clean.py", "no_optimizer.py", "pd001_dataparallel.py", "pd002_dataloader_workers.py",
           "pd002_config_dict.py", "pd003_pin_memory.py", "pd004_cpu_tensor_to_device.py",
           "pd005_empty_cache.py", "pd006_loss_graph_retained.py", "pd006_running_sum.py",
           "pd007_fp32_without_amp.py", "pd013_anomaly_detection.py", "pd014_slow_dataset.py",
           "pd002_dataloader_workers_fixed.py"]
KEEP = ("meta.json", "steps.json", "probes.json", "hotspots.json", "trace.json.gz")
REPO_MARK, RUN_MARK = "@REPO@", "@RUN@"


def _swap_text(path: Path, pairs: list[tuple[str, str]]) -> None:
    gz = path.suffix == ".gz"
    data = gzip.decompress(path.read_bytes()).decode() if gz else path.read_text()
    for a, b in pairs:
        data = data.replace(a, b)
    if gz:
        path.write_bytes(gzip.compress(data.encode(), mtime=0))
    else:
        path.write_text(data)


# a place whose path has the same length on every machine (the text report wraps long paths), one per
# checkout (so that checkouts side by side do not overwrite each other's folders)
PLACE = Path("/tmp" if Path("/tmp").is_dir() else tempfile.gettempdir()) / (
    "pdgolden-" + hashlib.sha256(str(REPO).encode()).hexdigest()[:8])


def materialise(name: str) -> Path:
    """A copy of the recorded run folder `name`, with this checkout's paths put back."""
    run = PLACE / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(RUNS / name, run)
    for f in run.iterdir():
        _swap_text(f, [(REPO_MARK, str(REPO)), (RUN_MARK, str(run))])
    return run


def golden_inputs() -> list[tuple[str, str]]:
    """(id, kind) of every golden input: recorded run folders and the traces in tests/data."""
    out = [(p.name, "run") for p in sorted(RUNS.iterdir()) if p.is_dir()]
    out += [(p.name, "trace") for p in sorted(TRACES.iterdir()) if p.is_dir() or p.name.endswith((".json", ".json.gz"))]
    return out


FORMATS = ("json", "text", "markdown", "sarif", "github")


def _render(report, fmt: str) -> str:
    """The report as `perfdoctor report --format FMT --output FILE` writes it."""
    import io

    from perfdoctor.report.formats import render

    if fmt != "text":
        return render(fmt, report)
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=100, no_color=True).print(render(fmt, report))
    return buf.getvalue()


def outputs_of(ident: str, kind: str, formats: tuple[str, ...] = FORMATS) -> dict[str, str]:
    """{format: the rendered report of one golden input, with this checkout's paths replaced by marks}."""
    return outputs_and_reread(ident, kind, formats)[0]


def outputs_and_reread(ident: str, kind: str, formats: tuple[str, ...] = FORMATS
                       ) -> tuple[dict[str, str], dict[str, str]]:
    """`outputs_of`, and the same rendered from the report's report.json read back (`perfdoctor report
    report.json`) instead of from the analysis."""
    from perfdoctor.analysis import analyse_path
    from perfdoctor.contracts.report import decode_report
    from perfdoctor.model import from_doc
    from perfdoctor.report import jsonfmt

    run = materialise(ident) if kind == "run" else None
    report = analyse_path(run if run is not None else TRACES / ident)
    reread = from_doc(decode_report(Path("report.json"), jsonfmt.render_report(report).encode()))
    outs: tuple[dict[str, str], dict[str, str]] = ({}, {})
    for r, out in zip((report, reread), outs):
        for fmt in formats:
            doc = _render(r, fmt)
            if run is not None:
                doc = doc.replace(str(run), RUN_MARK)
            out[fmt] = doc.replace(str(REPO), REPO_MARK)
    return outs


def record_runs() -> None:
    RUNS.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for name in SAMPLES:
        stem = Path(name).stem
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / stem
            p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", str(REPO / "sample_scripts" / name),
                                "--steps", "25", "--format", "json", "--out-dir", str(out)],
                               cwd=REPO / "sample_scripts", env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name}: exit {p.returncode}\n{p.stderr[-2000:]}")
            dest = RUNS / stem
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            for f in KEEP:
                if (out / f).is_file():
                    shutil.copy(out / f, dest / f)
                    _swap_text(dest / f, [(str(out), RUN_MARK), (str(REPO), REPO_MARK)])
        print("recorded", stem)


def record_reports() -> None:
    EXPECTED.mkdir(exist_ok=True)
    for ident, kind in golden_inputs():
        for fmt, doc in outputs_of(ident, kind).items():
            (EXPECTED / f"{ident}.{fmt}").write_text(doc)
        print("wrote", ident)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "runs":
        record_runs()
    elif what == "reports":
        record_reports()
    else:
        sys.exit(__doc__)
