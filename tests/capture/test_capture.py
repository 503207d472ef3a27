"""perfdoctor run, capture side: the child, the probes, the run folder (real child processes)."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfdoctor.capture import run_script
from perfdoctor.capture.window import plan
from perfdoctor.facts.run import load_run

pytestmark = pytest.mark.e2e  # runs real training scripts under perfdoctor: minutes, not seconds

SMALL = (1, 1, 2)  # a small profiler window keeps the tests fast

COMMON = """
import torch, torch.nn as nn
torch.set_num_threads(1)
def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
"""


def write(d: Path, name: str, src: str) -> Path:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(src).lstrip())
    (d / "common.py").write_text(COMMON)
    return p


def files(run_dir: Path) -> tuple[dict, list[dict], dict]:
    meta = json.loads((run_dir / "meta.json").read_text())
    steps = json.loads((run_dir / "steps.json").read_text())["steps"]
    probes = json.loads((run_dir / "probes.json").read_text()) if (run_dir / "probes.json").exists() else {}
    return meta, steps, probes


def line_of(path: Path, text: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if text in l)


TRAIN = """
import argparse, torch
from torch.utils.data import DataLoader, Dataset
from common import make

class Squares(Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        s = 0
        for k in range(2000):
            s += k * i
        return torch.full((32,), float(i % 7)), torch.tensor(float(s % 5))

class AverageMeter:
    def __init__(self):
        self.vals = []
    def update(self, v):
        self.vals.append(v)

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, required=True)
    a = p.parse_args()
    cfg = dict(batch_size=64, shuffle=False)
    loader = DataLoader(Squares(), **cfg)
    m = make()
    opt = torch.optim.SGD(m.parameters(), lr=a.lr)
    meter = AverageMeter()
    running = 0.0
    total = 0.0
    detached = []
    for x, y in loader:
        out = m(x)
        loss = (out[:, 0] - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        meter.update(loss)
        running += loss
        total += loss.item()
        detached.append(loss.detach())
    print("finished")

if __name__ == "__main__":
    main()
"""


def test_steps_argparse_probes_and_holders(tmp_path, capfd):
    script = write(tmp_path, "train.py", TRAIN)
    r = run_script(str(script), script_args=["--lr", "0.01"], steps=12, out_dir=tmp_path / "run")
    assert (r.exit_code, r.reason) == (0, "steps-reached")
    meta, steps, probes = files(r.run_dir)
    assert meta["complete"] and meta["exit"]["reason"] == "steps-reached"
    assert meta["argv"] == [str(script), "--lr", "0.01"]
    assert meta["step_clock"] == "optimizer"
    assert [s["i"] for s in steps] == list(range(1, 13))
    assert all(s["wall_ms"] > 0 and s["forward_ms"] > 0 and s["backward_ms"] > 0 for s in steps)
    assert all(s["mem_bytes"] > 10_000_000 for s in steps)  # process RSS on the CPU
    assert "finished" not in capfd.readouterr().out  # stopped after 12 steps

    # the default window (skip 5, warmup 2, active 5) fits 12 steps exactly
    w = meta["window"]
    assert (w["skip"], w["warmup"], w["active"], w["first_step"], w["last_step"]) == (4, 3, 5, 8, 12)
    assert w["completed"] and w["steps_profiled"] == 5 and w["trace"]
    trace = json.loads(gzip.decompress((r.run_dir / "trace.json.gz").read_bytes()))
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("ProfilerStep#") for n in names) and "aten::addmm" in names

    (dl,) = probes["dataloaders"]
    assert dl["kwargs_style"] == "dict" and dl["kwargs"]["batch_size"] == 64 and dl["kwargs"]["num_workers"] == 0
    assert dl["site"]["line"] == line_of(script, "loader = DataLoader(") and dl["dataset"] == "Squares"
    assert dl["batches"] == 12 and len(dl["wait_ms_per_step"]) == 12 and min(dl["wait_ms_per_step"][1:]) > 0

    fwd = {f["module"]: f for f in probes["forward"]}
    assert fwd["Sequential"]["calls"] == 12 and fwd["Sequential"]["param_dtype"] == "float32"
    assert fwd["Sequential"]["autocast"] is False and fwd["Sequential"]["site"]["code"] == "out = m(x)"

    holders = {h["holder"]: h for h in probes["loss_holders"]}
    assert set(holders) == {"meter.vals", "running"}  # not total (floats), detached, loss or out
    assert holders["meter.vals"]["kind"] == "attribute" and holders["meter.vals"]["tensor_name"] == "loss"
    assert holders["meter.vals"]["site"]["line"] == line_of(script, "meter.update(loss)")
    assert holders["running"]["kind"] == "running-sum" and holders["running"]["tensor_name"] == "loss"
    assert holders["running"]["site"]["code"] == "running += loss"
    assert holders["running"]["graphs_per_step"] == 1.0

    # cProfile and the sampler saw the Dataset's Python loop
    hs = json.loads((r.run_dir / "hotspots.json").read_text())
    assert hs["steps"] == 3  # the warm-up steps: the recorded ones belong to the trace's Python tracer
    getitem = [f for f in hs["functions"] if f["function"] == "__getitem__"]
    assert getitem and getitem[0]["ncalls"] == 3 * 64 and getitem[0]["file"] == str(script)
    assert all("torch" not in f["file"] for f in hs["functions"])
    assert (r.run_dir / "profile.pstats").stat().st_size > 0

    data = load_run(r.run_dir)
    assert data.facts.value("run.step_clock") == "optimizer"
    assert [p.name for p in data.user_files] == ["train.py", "common.py"]
    hot = {h.function: h for h in data.hotspots}
    body = range(line_of(script, "def __getitem__"), line_of(script, "return torch.full") + 1)
    assert hot["__getitem__"].calls_per_step == 64 and hot["__getitem__"].ms_per_step > 0
    assert hot["__getitem__"].lines and all(l.line in body for l in hot["__getitem__"].lines)
    (lh,) = [s for s in data.facts.of_kind("loss_holder") if s.facts["loss_holder.holder"].value == "running"]
    assert lh.key == f"{script}:{line_of(script, 'running += loss')}"


def test_missing_required_args_and_exit_code(tmp_path, capfd):
    script = write(tmp_path, "train.py", TRAIN)
    r = run_script(str(script), out_dir=tmp_path / "run")
    assert (r.exit_code, r.reason) == (2, "sys-exit")
    assert "the following arguments are required: --lr" in capfd.readouterr().err
    meta, steps, _ = files(r.run_dir)
    assert meta["step_clock"] == "none" and len(steps) == 1  # the whole run is one span


def test_module_sys_exit(tmp_path):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/job.py", """
        import sys, torch
        from common import make
        m = make(); opt = torch.optim.Adam(m.parameters())
        for i in range(int(sys.argv[1])):
            loss = m(torch.randn(8, 32)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        sys.exit(3)
    """)
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = run_script("pkg.job", module=True, script_args=["4"], window=SMALL)
    finally:
        os.chdir(cwd)
    assert (r.exit_code, r.reason) == (3, "sys-exit")
    assert r.run_dir.parent == tmp_path / ".perfdoctor" / "runs" and r.run_dir.name.startswith("job-")
    meta, steps, _ = files(r.run_dir)
    assert meta["module"] == "pkg.job" and meta["argv"] == ["pkg.job", "4"] and len(steps) == 4
    assert str(tmp_path / "pkg" / "job.py") in meta["user_files"]


def test_exception_keeps_traceback_and_partial_steps(tmp_path, capfd):
    script = write(tmp_path, "boom.py", """
        import torch
        from common import make
        def train():
            m = make(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for i in range(20):
                loss = m(torch.randn(8, 32)).sum(); opt.zero_grad(); loss.backward(); opt.step()
                if i == 6:
                    raise ValueError("bad batch")
        train()
    """)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL)
    assert (r.exit_code, r.reason) == (1, "exception")
    meta, steps, _ = files(r.run_dir)
    tb = meta["exit"]["traceback"]
    assert tb.startswith("Traceback") and tb.rstrip().endswith("ValueError: bad batch")
    assert f'File "{script}", line 8, in train' in tb and "runpy" not in tb and "perfdoctor" not in tb
    assert tb in capfd.readouterr().err
    assert len(steps) == 7
    assert any("failed after 7 steps: ValueError: bad batch" in n for n in load_run(r.run_dir).notes)


def test_spawn_dataloader_with_dataset_in_script(tmp_path, capfd):
    script = write(tmp_path, "spawn.py", """
        import torch
        from torch.utils.data import Dataset, DataLoader
        from common import make
        class Squares(Dataset):
            def __len__(self): return 48
            def __getitem__(self, i):
                return torch.full((32,), float(i)), torch.tensor(float(i * i))
        if __name__ == "__main__":
            dl = DataLoader(Squares(), batch_size=8, num_workers=2, multiprocessing_context="spawn")
            m = make(); opt = torch.optim.SGD(m.parameters(), lr=1e-6)
            n = 0
            for x, y in dl:
                loss = (m(x)[:, 0] - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step(); n += 1
            print("batches", n)
    """)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL, script_stdout_to_stderr=True)
    out, err = capfd.readouterr()
    assert (r.exit_code, r.reason) == (0, "completed"), err
    assert "batches 6" in err and "batches 6" not in out  # the script's stdout went to our stderr
    meta, steps, probes = files(r.run_dir)
    assert len(steps) == 6
    (dl,) = probes["dataloaders"]
    assert dl["kwargs"]["num_workers"] == 2 and dl["kwargs"]["multiprocessing_context"] == "spawn"
    assert dl["batches"] == 6 and dl["kwargs_style"] == "literal"


def test_no_optimizer_backward_clock_and_os_exit(tmp_path):
    script = write(tmp_path, "noopt.py", """
        import os, torch
        from common import make
        m = make()
        for i in range(15):
            loss = m(torch.randn(16, 32)).pow(2).mean()
            m.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.01 * p.grad
        os._exit(5)
    """)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL)
    assert (r.exit_code, r.reason) == (5, "sys-exit")
    meta, steps, probes = files(r.run_dir)
    assert meta["step_clock"] == "backward" and len(steps) == 15 and meta["complete"]
    assert all(s["optimizer_ms"] == 0 for s in steps) and all(s["backward_ms"] > 0 for s in steps)
    assert probes["loss_holders"] == []
    assert "no optimizer step seen: steps counted by backward() calls" in load_run(r.run_dir).notes


def test_killed_child_gets_meta_from_parent(tmp_path):
    script = write(tmp_path, "killme.py", """
        import os, signal, time, torch
        from common import make
        m = make(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(25):
            loss = m(torch.randn(8, 32)).sum(); opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(0.06)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL)
    assert (r.exit_code, r.reason) == (128 + signal.SIGKILL, "killed")
    meta, steps, _ = files(r.run_dir)
    assert meta["finalised_by"] == "parent" and meta["step_clock"] == "optimizer"
    assert 10 <= len(steps) <= 25 and [s["i"] for s in steps] == list(range(1, len(steps) + 1))
    assert not (r.run_dir / "steps.partial.jsonl").exists()
    assert any("killed" in n for n in load_run(r.run_dir).notes)


def test_steps_limit_when_script_swallows_system_exit(tmp_path, capfd):
    script = write(tmp_path, "swallow.py", """
        import torch
        from common import make
        m = make(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(200):
            try:
                loss = m(torch.randn(8, 32)).sum(); opt.zero_grad(); loss.backward(); opt.step()
            except BaseException:
                pass
        print("never")
    """)
    r = run_script(str(script), out_dir=tmp_path / "run", steps=4)
    assert (r.exit_code, r.reason) == (0, "steps-reached")
    assert "never" not in capfd.readouterr().out
    meta, steps, _ = files(r.run_dir)
    assert len(steps) == 4 and meta["window"]["completed"]
    assert (meta["window"]["skip"], meta["window"]["active"]) == plan(4)[::2]


def test_sigint_to_parent_interrupts_and_saves(tmp_path):
    write(tmp_path, "long.py", """
        import time, torch
        from common import make
        m = make(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        try:
            for i in range(100000):
                loss = m(torch.randn(8, 32)).sum(); opt.zero_grad(); loss.backward(); opt.step()
                time.sleep(0.01)
        finally:
            print("script finally ran", flush=True)
    """)
    run = tmp_path / "run"
    code = (f"from perfdoctor.capture import run_script; r = run_script('long.py', out_dir={str(run)!r}, "
            "window=(1, 1, 2)); print('RESULT', r.exit_code, r.reason)")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    partial = run / "steps.partial.jsonl"
    t = time.time()
    while time.time() - t < 60 and not (partial.exists() and partial.read_text().count('"i"') >= 3):
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert "RESULT 130 interrupted" in out and "script finally ran" in out
    meta, steps, _ = files(run)
    assert meta["exit"]["reason"] == "interrupted" and meta["exit"]["traceback"].rstrip().endswith("KeyboardInterrupt")
    assert "finalised_by" not in meta and len(steps) >= 3  # the child wrote it all itself


def test_missing_script_is_usage_error(tmp_path):
    from perfdoctor.errors import InputError

    with pytest.raises(InputError, match="no such script"):
        run_script(str(tmp_path / "nope.py"))


# -- in-process pieces: the holder scanner, the window plan, call-site reading ------------------

def test_window_plan_fits_inside_steps():
    assert plan(None) == (5, 3, 5) and plan(100) == (5, 3, 5) and plan(13) == (5, 3, 5)
    assert plan(12) == (4, 3, 5) and plan(3) == (1, 1, 1) and plan(2) == (1, 0, 1)
    for n in range(1, 12):
        skip, warmup, active = plan(n)
        assert skip + warmup + active == n and active >= 1


def test_chain_depth_grows_for_running_sum_only():
    torch = pytest.importorskip("torch")
    from perfdoctor.capture.probes.holders import chain_depth

    w = torch.ones(3, requires_grad=True)
    running = 0.0
    for _ in range(5):
        running += (w * 2).sum()
    loss = (w * 3).sum()
    assert chain_depth(running.grad_fn) >= 3 and chain_depth(loss.grad_fn) == 0


def test_scanner_flags_lists_and_running_sums_not_items_or_detached(tmp_path):
    torch = pytest.importorskip("torch")
    import importlib.util

    from perfdoctor.capture.probes.holders import HolderScanner

    src = write(tmp_path, "userloop.py", """
        def train(w, scan):
            history = []
            running = 0.0
            both = 0.0
            total = 0.0
            kept = []
            for step in range(1, 7):
                loss = (w * step).sum()
                loss.backward()
                history.append(loss)
                running = running + loss
                both = both + loss + loss * 2  # two links a step
                total += loss.item()
                kept.append(loss.detach())
                out = w * 0
                for t in range(3 + (step % 2) * step):  # a decoder's outputs over this batch's length
                    out = out + w * t
                scan(step)
    """)
    spec = importlib.util.spec_from_file_location("userloop", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    scanner = HolderScanner(torch)
    mod.train(torch.ones(4, requires_grad=True), lambda i: scanner.scan(i, sys._getframe(1)))
    by = {r.holder: r for r in scanner.records()}
    assert set(by) == {"history", "running", "both"}  # not `out`, whose depth is its batch's length
    assert by["history"].kind == "list" and by["history"].tensor_name == "loss"
    assert by["history"].site.code == "history.append(loss)" and by["history"].graphs_retained == 6
    assert by["running"].kind == "running-sum" and by["running"].site.code == "running = running + loss"


def test_kwargs_style_reads_the_call():
    from perfdoctor.capture import sites

    def DataLoader(*a, **k):  # noqa: N802 - stands in for the real one
        return sites.kwargs_style(sys._getframe(1))

    cfg = {"batch_size": 2}
    assert DataLoader([1], batch_size=2) == "literal"
    assert DataLoader([1], **cfg) == "dict"
    assert DataLoader([1], shuffle=True, **cfg) == "mixed"
    assert DataLoader(*[[1]], batch_size=2) == "literal"  # positional *args are not keyword arguments


def test_a_package_pip_installed_into_a_folder_on_sys_path_is_not_the_users(tmp_path, monkeypatch):
    from perfdoctor import usercode

    site = tmp_path / "site"  # `pip install --target site lightning`, then PYTHONPATH=site
    for rel in ("lightning/trainer.py", "yaml/__init__.py", "mine/model.py", "train.py"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("")
    (site / "lightning-2.6.6.dist-info").mkdir()
    (site / "lightning-2.6.6.dist-info" / "top_level.txt").write_text("lightning\n")
    (site / "PyYAML-6.0.dist-info").mkdir()  # no top_level.txt: its RECORD's paths say
    (site / "PyYAML-6.0.dist-info" / "METADATA").write_text("Name: PyYAML\nVersion: 6.0\n")
    (site / "PyYAML-6.0.dist-info" / "RECORD").write_text("yaml/__init__.py,,\nPyYAML-6.0.dist-info/RECORD,,\n")
    proj = tmp_path / "proj"  # the user's project, set up with an old `setup.py develop`: an egg-info
    (proj / "mine.egg-info").mkdir(parents=True)
    (proj / "mine.egg-info" / "top_level.txt").write_text("mine\n")
    (proj / "mine").mkdir()
    (proj / "mine" / "model.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(proj), str(site), *sys.path])
    usercode.reset_cache()
    try:
        assert not usercode.is_user_file(str(site / "lightning" / "trainer.py"))
        assert not usercode.is_user_file(str(site / "yaml" / "__init__.py"))
        assert usercode.is_user_file(str(site / "mine" / "model.py"))  # no wheel there lists it
        assert usercode.is_user_file(str(site / "train.py"))
        assert usercode.is_user_file(str(proj / "mine" / "model.py"))
    finally:
        monkeypatch.undo()
        usercode.reset_cache()


def test_is_user_file_for_this_machine_and_recorded_paths(tmp_path):
    import os
    import sysconfig

    from perfdoctor.usercode import is_user_file

    assert is_user_file(str(tmp_path / "train.py")) and is_user_file("/home/me/proj/data.py")
    assert is_user_file("train.py")  # a trace's relative user file
    assert not is_user_file(os.path.join(sysconfig.get_paths()["stdlib"], "threading.py"))
    assert not is_user_file(os.path.abspath(__import__("perfdoctor").__file__))
    for other in ("/opt/venv/lib/python3.12/site-packages/x/y.py", "/usr/lib/python3/dist-packages/z.py",
                  "/usr/lib/python3.10/threading.py", "/home/me/pytorch/torch/nn/modules/module.py",
                  "torch/nn/modules/module.py", "threading.py", "multiprocessing/queues.py", "<string>", "~", ""):
        assert not is_user_file(other), other


def test_a_user_folder_named_torch_is_the_users(tmp_path):
    """philtabor's `ReinforcementLearning/PolicyGradient/PPO/torch/ppo_torch.py`: a project folder named
    `torch` on this machine holds the user's code (torch's own files lie where torch is installed); a
    recorded path of that shape from another machine stays torch's."""
    import os

    from perfdoctor import usercode

    torch = pytest.importorskip("torch")
    mine = tmp_path / "PPO" / "torch" / "ppo_torch.py"
    mine.parent.mkdir(parents=True)
    mine.write_text("")
    usercode.reset_cache()
    try:
        assert usercode.is_user_file(str(mine))
        torch_file = os.path.abspath(torch.__file__)
        assert not usercode.is_user_file(os.path.join(os.path.dirname(torch_file), "nn", "modules", "module.py"))
        assert not usercode.is_user_file("/home/me/pytorch/torch/nn/modules/module.py")  # not a file here
        assert not usercode.is_user_file(str(tmp_path / "PPO" / "torch" / "missing.py"))
    finally:
        usercode.reset_cache()


def test_a_statistics_pass_over_a_loader_is_not_the_steps(tmp_path):
    """A dataset's mean taken over a DataLoader before training (no model called on its batches) is
    data loading: `--steps 3` stops in the training loop, not 3 batches into that pass."""
    script = write(tmp_path, "stats.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from common import make
        ds = TensorDataset(torch.randn(64, 32), torch.randn(64, 4))
        mean = torch.cat([x for x, _ in DataLoader(ds)]).mean(0)  # 64 batches, no model
        m = make()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for x, y in DataLoader(ds, batch_size=8):
            loss = (m(x - mean) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("trained")
    """)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL, steps=3)
    meta, steps, _ = files(r.run_dir)
    assert meta["step_clock"] == "optimizer" and len(steps) == 3 and r.reason == "steps-reached"
