"""The analysis is total: no user code sends the static read into an endless recursion or an
unbounded time, and an internal error in one family of facts becomes a note of the report, never
the loss of it (issue 19, "never fail on real code")."""

from __future__ import annotations

import ast
import shutil
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import perfdoctor.facts.static as static
from perfdoctor.analysis import analyse_run
from perfdoctor.contracts.run import exception_line
from perfdoctor.facts.model import Facts
from perfdoctor.facts.static import analyse_files
from perfdoctor.facts.static.index import SourceIndex
from tests.facts.test_run_facts import make_run
from tests.helpers import CPU

# the idiom that sent the static index into a RecursionError after the script had finished
REBIND = """\
import torch
import torch.nn as nn


def train(device="cpu"):
    device = torch.device(device)
    model = nn.Linear(4, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        x = torch.randn(8, 4).to(device)
        loss = model(x).sum()
        opt.zero_grad(); loss.backward(); opt.step()


train()
"""


def _read(tmp_path: Path, source: str, name: str = "train.py") -> tuple[Facts, Path, float]:
    path = tmp_path / name
    path.write_text(source)
    facts = Facts()
    t0 = time.process_time()  # CPU time: a bound on the work, whatever else the machine runs
    analyse_files([path], facts)
    return facts, path, time.process_time() - t0


def test_a_device_parameter_rebound_to_itself(tmp_path):
    facts, path, _ = _read(tmp_path, REBIND)
    assert facts.failures == []
    # the read went through: the tensor made on the host and moved every step is found
    s = facts.of_kind("cpu_to_device")
    assert [x.key for x in s] == [f"{path.resolve()}:10"] and s[0].facts["cpu_to_device.in_loop"].value is True


def test_cycles_in_name_binding_end(tmp_path):
    facts, _, took = _read(tmp_path, textwrap.dedent("""\
        import torch
        a = b
        b = a
        dtype = dtype
        use_cuda = not use_cuda
        device = torch.device(device if device else other)
        other = device
        for i in range(3):
            x = torch.zeros(2).to(a).to(dtype).to(device)
            if use_cuda:
                torch.cuda.empty_cache()
        """))
    assert facts.failures == [] and took < 5


def test_fan_out_of_many_assignments_stays_linear(tmp_path):
    # every name assigned from every other, many times over: following names without a memo is
    # names ** depth evaluations
    names = [f"d{i}" for i in range(40)]
    lines = ["import torch"] + [f"{n} = {m} if flag else {k}" for n in names for m, k in zip(names, names[1:])]
    lines += ["for i in range(3):", "    x = torch.ones(2).to(d0)", "    y = x.cuda() if d1 else x"]
    facts, _, took = _read(tmp_path, "\n".join(lines) + "\n")
    assert facts.failures == [] and took < 20


@pytest.mark.parametrize("source", [
    # nested conditional expressions a parser takes and a naive recursive reading does not
    "import torch\ndevice = " + " if c else ".join(["'cuda'"] * 2000) + "\nx = torch.zeros(1).to(device)\n",
    # long operator chains, deep blocks, deep calls
    "import torch\nx = " + " + ".join(["torch.zeros(1).cuda()"] * 2000) + "\n",
    "import torch\n" + "".join(" " * i + f"for i{i} in range(2):\n" for i in range(90))
    + " " * 90 + "torch.cuda.empty_cache()\n",
    "import torch\nx = " + "f(" * 150 + "torch.zeros(1).to('cuda')" + ")" * 150 + "\n",
])
def test_deep_sources_read_without_an_error(tmp_path, source):
    try:
        ast.parse(source)
    except (RecursionError, SyntaxError, MemoryError):
        pytest.skip("this Python's parser refuses it: nothing for the static read to do")
    facts, _, took = _read(tmp_path, source)
    assert facts.failures == [] and took < 20


def test_a_huge_file_reads_within_a_bound(tmp_path):
    body = "".join(textwrap.dedent(f"""\
        def step{i}(model, batch, device, optimizer):
            x = batch.to(device)
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            print(loss.item())
            return torch.zeros(3).to(device)
        """) for i in range(300))
    source = "import torch\n" + body + "for b in loader:\n" + "".join(f"    step{i}(m, b, d, o)\n" for i in range(300))
    facts, _, took = _read(tmp_path, source)
    # a loop of 300 step calls: walked once per loop and per name, not once per call (75 s before, 10 s
    # after, wall time at a load of 20 on 2 cores)
    assert facts.failures == [] and took < 60
    assert len(facts.of_kind("cpu_to_device")) == 300


def _boom(index: SourceIndex, facts: Facts) -> None:
    """A detector with a bug: it adds a fact and a subject, then fails."""
    facts.add("script.targets_cuda", True, source="static")
    index.subject(facts, "empty_cache", index.tree.body[0])  # type: ignore[arg-type]
    raise RecursionError("maximum recursion depth exceeded")


def test_a_failing_detector_is_a_note_and_the_rest_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(static, "DETECTORS", (_boom, *static.DETECTORS))
    d = make_run(tmp_path / "run")
    (d / "train.py").write_text(REBIND)
    report = analyse_run(d)
    failed = [n for n in report.notes if "perfdoctor's own analysis failed" in n]
    assert len(failed) == 1 and "RecursionError" in failed[0] and "_boom" not in failed[0]
    assert "the static test_analysis_total detector on train.py" in failed[0]
    # what the failing family added is taken back; the other detectors' facts are there
    assert "script.targets_cuda" not in report.facts or report.facts["script.targets_cuda"].value is False
    facts = Facts()
    monkeypatch.setattr(static, "DETECTORS", (_boom, *static.DETECTORS))
    analyse_files([d / "train.py"], facts)
    assert facts.of_kind("cpu_to_device") and not facts.of_kind("empty_cache")


def test_family_takes_back_what_it_changed():
    facts = Facts()
    s = facts.subject("dataloader", "t.py:3")
    s.add("num_workers", 0, source="static")
    with facts.family("a test family"):
        s.add("num_workers", 4, source="run")
        facts.subject("dataloader", "t.py:9").add("num_workers", 2)
        facts.add("step.time_ms", 3.0)
        raise KeyError("x")
    assert facts.failures == ["a test family: KeyError: 'x'"]
    assert [x.key for x in facts.of_kind("dataloader")] == ["t.py:3"]
    assert s.facts["dataloader.num_workers"].value == 0 and "step.time_ms" not in facts


def test_bad_input_keeps_its_exit_code():
    from perfdoctor.errors import InputError

    facts = Facts()
    with pytest.raises(InputError), facts.family("a family"):
        raise InputError("bad trace")
    assert facts.failures == []


TRACING_FAILURE = """\
Traceback (most recent call last):
  File "/x/train.py", line 40, in <module>
    writer.add_graph(net, images)
  File "/venv/torch/jit/_trace.py", line 1000, in trace
    _check_trace(
torch.jit._trace.TracingCheckError: Tracing failed sanity checks!
ERROR: Graphs differed across invocations!
\tGraph diff:
\t\t  graph(%self.1 : __torch__.Net,
\t\t-   %x : Tensor):
\t\t?   ^^
"""


def test_the_failure_note_shows_the_exception_line():
    assert exception_line(TRACING_FAILURE) == ("torch.jit._trace.TracingCheckError: Tracing failed sanity checks!")
    chained = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    f()\nKeyError: 'a'\n\n"
               "During handling of the above exception, another exception occurred:\n\n"
               "Traceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    g()\n"
               "ValueError: bad\nvalue\n")
    assert exception_line(chained) == "ValueError: bad"
    assert exception_line("SystemExit: 3") == "SystemExit: 3"
    assert exception_line("Traceback ...\nValueError: the real cause\n") == "ValueError: the real cause"
    assert exception_line("") == "an exception" and exception_line(None) == "an exception"
    syntax = 'File "/tmp/syn.py", line 3\n    if x = 2:\n       ^^^^^\nSyntaxError: invalid syntax\n'
    assert exception_line(syntax) == "SyntaxError: invalid syntax"  # a stripped SyntaxError traceback


def _fp32_run(tmp_path: Path, source: str) -> Any:
    """A CPU run without AMX of an fp32 model of 3M parameters (no autocast), its script `source`: 30 GFLOP
    a step counted, a profiled window (the CPU MLP trace) whose ops' launch floor is far below their math."""
    site = {"file": str(tmp_path / "run" / "train.py"), "line": 6, "code": "loss = model(x).sum()", "function": "<module>"}
    probes = {"forward": [{"site": site, "module": "Net", "calls": 40, "params": 3_000_000, "autocast": False,
                           "param_dtype": "float32", "device": "cpu"}],
              "flops": {"step": 2, "flops": 30_000_000_000, "ops": {"aten.mm": 30_000_000_000}}}
    d = make_run(tmp_path / "run", probes=probes)
    (d / "train.py").write_text(source)
    shutil.copy(CPU, d / "trace.json.gz")
    return analyse_run(d)


def test_the_fp32_note_never_contradicts_pd007(tmp_path):
    # a script that targets CUDA is judged for its GPU (PD007 fires): no note that this CPU's lack
    # of AMX kept PD007 quiet beside it
    cuda = _fp32_run(tmp_path / "a", "import torch\nmodel = Net().cuda()\nopt = torch.optim.SGD(model.parameters())\n"
                                     "for x in data:\n    x = x.cuda()\n    loss = model(x).sum()\n    loss.backward()\n"
                                     "    opt.step()\n")
    assert any(f.rule == "PD007" for f in cuda.findings)
    assert not any("not flagged (PD007)" in n for n in cuda.notes)
    # a CPU-only script: PD007 is quiet, and the note says why
    cpu = _fp32_run(tmp_path / "b", "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters())\n"
                                    "for x in data:\n    x = x.float()\n    loss = model(x).sum()\n    loss.backward()\n"
                                    "    opt.step()\n")
    assert not any(f.rule == "PD007" for f in cpu.findings)
    assert any("not flagged (PD007): the script runs on the CPU only" in n for n in cpu.notes)
