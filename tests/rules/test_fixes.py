"""Fixes rendered against the user's own line (perfdoctor/rules/fixes/)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from perfdoctor.model import Location
from perfdoctor.rules.fixes import render_fix
from perfdoctor.rules.fixes.dataparallel_to_ddp import DDP_NOTE

SCRIPT = '''\
import torch
import torch.nn as nn
from torch.nn import DataParallel as DP
from torch.utils.data import DataLoader

model = nn.DataParallel(model, device_ids=[0, 1])
loader = DataLoader(ds, batch_size=32)
loader = DataLoader(
    ds,
    batch_size=32,
    shuffle=True,
)
loader = DataLoader(ds, **cfg)
loader = DataLoader(ds, num_workers=1, **cfg)
noise = torch.randn(4, 4).cuda()
z = torch.zeros(n).to(device, torch.float16)
x = torch.randn(3, 3)
y = 2
x = x.to(device)
for xb, yb in loader:
    xb, yb = xb.to(device), yb.cuda()
    out = model(xb,
                yb)  # forward
    loss = crit(out, yb)
    history.append(loss)
    running += loss * 2
    meter.update(loss, n)
    torch.cuda.empty_cache()
    if i % 10 == 0:
        torch.cuda.empty_cache()
m2 = DP(model)
for a, b in DataLoader(ds, batch_size=4):
    pass
half = torch.randn(3).to(torch.float16)
'''


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def fix(path: Path, kind: str, line: int, params: dict | None = None, code: str = ""):
    f = render_fix(kind, Location(str(path), line, code), params or {})
    if f is not None:  # every rendered fix is valid Python
        after = textwrap.dedent(f.after)
        ast.parse(after + ("\n    pass" if after.rstrip().endswith(":") else ""))
        if path.read_text() == SCRIPT:  # `before` is the user's statement, whole lines, as written
            assert ("\n" + f.before + "\n") in ("\n" + SCRIPT)
    return f


DL_SET = {"callee": "DataLoader", "set": {"num_workers": "4", "pin_memory": "True", "persistent_workers": "True"}}


def test_call_kwargs_one_line(script):
    f = fix(script, "call-kwargs", 7, DL_SET)
    assert f.before == "loader = DataLoader(ds, batch_size=32)"
    assert f.after == "loader = DataLoader(ds, batch_size=32, num_workers=4, pin_memory=True, persistent_workers=True)"
    assert f.note == ""


def test_call_kwargs_multi_line_keeps_style(script):
    for line in (8, 10, 12):  # any line of the statement finds it
        f = fix(script, "call-kwargs", line, {"callee": "DataLoader", "set": {"num_workers": "4"}})
        assert f.before == "loader = DataLoader(\n    ds,\n    batch_size=32,\n    shuffle=True,\n)"
        assert f.after == "loader = DataLoader(\n    ds,\n    batch_size=32,\n    shuffle=True,\n    num_workers=4,\n)"


def test_call_kwargs_star_star_cfg(script):
    f = fix(script, "call-kwargs", 13, DL_SET)
    assert f.after == ('loader = DataLoader(ds, **{**cfg, "num_workers": 4, "pin_memory": True, '
                       '"persistent_workers": True})')
    assert "`cfg`" in f.note and "config" in f.note
    f = fix(script, "call-kwargs", 14, DL_SET)
    assert f.after == ('loader = DataLoader(ds, num_workers=4, **{**cfg, "pin_memory": True, '
                       '"persistent_workers": True})')
    # one `**` left, and no key both explicit and in the merged dict: no "multiple values" error
    call = ast.parse(f.after).body[0].value
    stars = [k for k in call.keywords if k.arg is None]
    explicit = {k.arg for k in call.keywords if k.arg}
    assert len(stars) == 1 and explicit == {"num_workers"}
    assert {k.value for k in stars[0].value.keys if k is not None} == {"pin_memory", "persistent_workers"}


def test_call_kwargs_replaces_and_in_for_header(script):
    f = fix(script, "call-kwargs", 32, {"callee": "DataLoader", "set": {"batch_size": "64", "num_workers": "2"}})
    assert f.before == "for a, b in DataLoader(ds, batch_size=4):"
    assert f.after == "for a, b in DataLoader(ds, batch_size=64, num_workers=2):"


def test_call_kwargs_no_match(script):
    assert fix(script, "call-kwargs", 18, DL_SET) is None  # `y = 2`
    assert fix(script, "call-kwargs", 7, DL_SET, code="loader = DataLoader(other)") is None  # file changed
    assert fix(script, "call-kwargs", 999, DL_SET) is None
    assert render_fix("call-kwargs", Location("/nonexistent/x.py", 3), DL_SET) is None


def test_the_users_file_is_read_through_the_size_guard(tmp_path: Path) -> None:
    """The fixer reads the flagged file as every reader of the user's files does
    (contracts.source.read_source): not past its size cap, never a FIFO (which would block)."""
    import os

    from perfdoctor.contracts.source import MAX_SOURCE_BYTES

    code = "loader = DataLoader(ds, batch_size=64)"
    ok = tmp_path / "ok.py"
    ok.write_text(code + "\n")
    assert render_fix("call-kwargs", Location(str(ok), 1, code), DL_SET) is not None
    big = tmp_path / "big.py"
    big.write_text(code + "\n" + "#" * MAX_SOURCE_BYTES + "\n")
    assert render_fix("call-kwargs", Location(str(big), 1, code), DL_SET) is None
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    assert render_fix("call-kwargs", Location(str(fifo), 1, code), DL_SET) is None


def test_dataparallel_to_ddp(script):
    f = fix(script, "dataparallel-to-ddp", 6)
    assert f.before == "model = nn.DataParallel(model, device_ids=[0, 1])"
    assert f.after == "model = nn.parallel.DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])"
    assert f.note.startswith(DDP_NOTE)
    assert "LOCAL_RANK" in f.note
    f = fix(script, "dataparallel-to-ddp", 31)
    assert f.after == "m2 = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])"
    assert "from torch.nn.parallel import DistributedDataParallel" in f.note
    assert fix(script, "dataparallel-to-ddp", 7) is None


def test_dataparallel_torch_nn_prefix(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("import torch\nnet = torch.nn.DataParallel(Net(), device_ids=[0, 1]).cuda()\n")
    f = render_fix("dataparallel-to-ddp", Location(str(p), 2), {})
    assert f.after == ("net = torch.nn.parallel.DistributedDataParallel(Net().to(local_rank), "
                       "device_ids=[local_rank]).cuda()")


def test_factory_device_chained(script):
    f = fix(script, "factory-device", 15)
    assert (f.before, f.after) == ("noise = torch.randn(4, 4).cuda()", 'noise = torch.randn(4, 4, device="cuda")')
    f = fix(script, "factory-device", 16)
    assert f.after == "z = torch.zeros(n, device=device, dtype=torch.float16)"
    assert fix(script, "factory-device", 34) is None  # .to(dtype) only


def test_factory_device_two_statements(script):
    f = fix(script, "factory-device", 17)
    assert (f.before, f.after) == ("x = torch.randn(3, 3)", "x = torch.randn(3, 3, device=device)")
    assert "line 19" in f.note and "x = x.to(device)" in f.note
    assert fix(script, "factory-device", 18) is None


def test_factory_device_two_statements_negatives(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("import torch\n"
                 "a = torch.randn(3)\na.normal_()\na = a.to(device)\n"       # used in between
                 "b = torch.randn(3)\ndev = pick()\nb = b.to(dev)\n"         # device defined in between
                 "c = torch.randn(3)\nc = c.to(torch.float16)\n")            # a dtype cast
    for line in (2, 5, 8):
        assert render_fix("factory-device", Location(str(p), line), {}) is None


def test_remove_call(script):
    f = fix(script, "remove-call", 28)
    assert (f.before, f.after) == ("    torch.cuda.empty_cache()", "")
    assert "empty_cache" in f.note
    f = fix(script, "remove-call", 30)  # the only statement of an `if`: the `if` goes too
    assert (f.before, f.after) == ("    if i % 10 == 0:\n        torch.cuda.empty_cache()", "")
    assert fix(script, "remove-call", 27) is None


def test_remove_call_never_leaves_an_empty_block(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("import torch\nfor i in r:\n    if i:\n        torch.cuda.empty_cache()\n"
                 "if a:\n    torch.cuda.empty_cache()\nelse:\n    b()\n")
    f = render_fix("remove-call", Location(str(p), 4), {})
    assert (f.before, f.after) == ("    if i:\n        torch.cuda.empty_cache()", "    pass")
    f = render_fix("remove-call", Location(str(p), 6), {})  # an `if` with an `else` stays
    assert (f.before, f.after) == ("    torch.cuda.empty_cache()", "    pass")


def test_detach_loss_follows_how_the_holder_is_used(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("def train(loader):\n    total = 0\n    for x in loader:\n        loss = f(x)\n"
                 "        loss.backward()\n        total += loss\n    avg = total / len(loader)\n"
                 "    return avg.item()\n\n"
                 "def train2(loader):\n    total = 0\n    for x in loader:\n        loss = f(x)\n"
                 "        loss.backward()\n        total += loss\n    print(total / 3)\n")
    f = render_fix("detach-loss", Location(str(p), 6), {"name": "loss", "method": "item"})
    assert f.after == "        total += loss.detach()"  # avg.item() later: total must stay a tensor
    f = render_fix("detach-loss", Location(str(p), 15), {"name": "loss", "method": "item"})
    assert f.after == "        total += loss.item()"  # used only as a number


def test_remove_call_keeps_other_statements(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("import torch\nfor i in r:\n    step(); torch.cuda.empty_cache()\n")
    f = render_fix("remove-call", Location(str(p), 3), {})
    assert (f.before, f.after) == ("    step(); torch.cuda.empty_cache()", "    step()")


def test_detach_loss(script):
    f = fix(script, "detach-loss", 25, {"name": "loss", "method": "item"})
    assert (f.before, f.after) == ("    history.append(loss)", "    history.append(loss.item())")
    f = fix(script, "detach-loss", 26, {"name": "loss", "method": "item"})
    assert f.after == "    running += loss.item() * 2"
    f = fix(script, "detach-loss", 27, {"name": "loss", "method": "detach"})
    assert f.after == "    meter.update(loss.detach(), n)"
    assert fix(script, "detach-loss", 24, {"name": "loss"}) is None  # `loss = crit(...)` holds nothing
    assert fix(script, "detach-loss", 25, {"name": "out"}) is None


def test_detach_loss_running_sum_assign(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("total = total + loss\nlosses.append(loss.item())\n")
    f = render_fix("detach-loss", Location(str(p), 1), {"name": "loss", "method": "item"})
    assert f.after == "total = total + loss.item()"
    assert render_fix("detach-loss", Location(str(p), 2), {"name": "loss", "method": "item"}) is None


def test_wrap_autocast_multi_line(script):
    f = fix(script, "wrap-autocast", 23, {"device_type": "cuda", "dtype": "torch.bfloat16"})
    assert f.before == "    out = model(xb,\n                yb)  # forward"
    assert f.after == ('    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
                       "        out = model(xb,\n                    yb)  # forward")
    assert "GradScaler" in f.note
    f = fix(script, "wrap-autocast", 22, {"device_type": "cuda", "dtype": "torch.float16"})
    assert "dtype=torch.float16" in f.after and "GradScaler(" in f.note
    assert fix(script, "wrap-autocast", 20, {}) is None  # a `for` header is not a simple statement


def test_wrap_autocast_alias_and_multiline_string(tmp_path):
    p = tmp_path / "t.py"
    p.write_text('import torch as th\n\ndef f():\n    out = model(x, tag="""a\nb""")\n')
    f = render_fix("wrap-autocast", Location(str(p), 4), {"device_type": "cuda", "dtype": "torch.bfloat16"})
    assert f.after == ('    with th.autocast(device_type="cuda", dtype=th.bfloat16):\n'
                       '        out = model(x, tag="""a\nb""")')


def test_wrap_no_grad(tmp_path):
    p = tmp_path / "t.py"
    p.write_text("import torch as th\n\ndef evaluate(model, x):\n    model.eval()\n    return model(x).argmax(1)\n"
                 "\nfor b in val:\n    evaluate(model, b)\n")
    f = render_fix("wrap-no-grad", Location(str(p), 5), {"context": "torch.no_grad()"})
    assert f.before == "    return model(x).argmax(1)"
    assert f.after == "    with th.no_grad():\n        return model(x).argmax(1)"
    f = render_fix("wrap-no-grad", Location(str(p), 8), {"context": "torch.inference_mode()"})
    assert f.after == "    with th.inference_mode():\n        evaluate(model, b)"
    assert render_fix("wrap-no-grad", Location(str(p), 4), {}).after.startswith("    with th.no_grad():")
    assert render_fix("wrap-no-grad", Location(str(p), 7), {}) is None  # a `for` header
    assert render_fix("wrap-no-grad", Location(str(p), 1), {}) is None  # an import


def test_non_blocking(script):
    f = fix(script, "non-blocking", 21)
    assert f.before == "    xb, yb = xb.to(device), yb.cuda()"
    assert f.after == "    xb, yb = xb.to(device, non_blocking=True), yb.cuda(non_blocking=True)"
    assert fix(script, "non-blocking", 34) is None  # .to(torch.float16)
    assert fix(script, "non-blocking", 18) is None


def test_unknown_kind_and_syntax_error(tmp_path, script):
    assert render_fix("no-such-kind", Location(str(script), 7), {}) is None
    bad = tmp_path / "bad.py"
    bad.write_text("loader = DataLoader(ds\n")
    assert render_fix("call-kwargs", Location(str(bad), 1), DL_SET) is None


def test_static_locations_feed_fixes(tmp_path):
    """The static read's subjects carry locations that the fixes render against."""
    from perfdoctor.facts.model import Facts
    from perfdoctor.facts.static import analyse_files

    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader

        model = nn.DataParallel(Net())
        loader = DataLoader(ds, batch_size=64)
        history = []
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            noise = torch.randn(64, 10).cuda()
            loss = nn.functional.mse_loss(model(x) + noise, y)
            loss.backward()
            history.append(loss)
            torch.cuda.empty_cache()
        """))
    facts = Facts()
    analyse_files([p], facts)
    loc = {k: facts.of_kind(k)[0].locations[0] for k in
           ("dataparallel", "dataloader", "cpu_to_device", "loss_holder", "empty_cache")}
    assert render_fix("dataparallel-to-ddp", loc["dataparallel"], {}).after == \
        "model = nn.parallel.DistributedDataParallel(Net().to(local_rank), device_ids=[local_rank])"
    assert render_fix("call-kwargs", loc["dataloader"], {"callee": "DataLoader", "set": {
        "num_workers": "4", "pin_memory": "True"}}).after == \
        "loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)"
    assert render_fix("factory-device", loc["cpu_to_device"], {}).after == \
        '    noise = torch.randn(64, 10, device="cuda")'
    holder = facts.of_kind("loss_holder")[0]
    assert render_fix("detach-loss", loc["loss_holder"], {
        "name": holder.facts["loss_holder.tensor_name"].value, "method": "item"}).after == \
        "    history.append(loss.item())"
    assert render_fix("remove-call", loc["empty_cache"], {}).after == ""
    assert render_fix("non-blocking", Location(str(p), 9), {}).after == \
        "    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)"


def test_wrap_autocast_only_wraps_computation(script):
    assert fix(script, "wrap-autocast", 1, {}) is None  # an import
    assert fix(script, "wrap-autocast", 18, {}) is None  # `y = 2`: nothing to compute


def test_apply_fix_replaces_the_statement_and_removes_a_line(tmp_path):
    from perfdoctor.model import Fix
    from perfdoctor.rules.fixes import apply_fix
    src = "for i in r:\n    x = 1\n    if i:\n        torch.cuda.empty_cache()\n    y = 2\n"
    assert apply_fix(src, Fix("    if i:\n        torch.cuda.empty_cache()", "")) == "for i in r:\n    x = 1\n    y = 2\n"
    assert apply_fix(src, Fix("    x = 1", "    x = 3")) == src.replace("x = 1", "x = 3")
    assert apply_fix(src, Fix("    z = 1", "")) is None
    assert apply_fix(src, Fix("    x = 1", "    x = 3", example=True)) is None
    # the same text at two places (a training forward, and the evaluation's after it): the flagged line's
    twice = "for x in train:\n    y = net(x)\n    y.sum().backward()\nfor x in test:\n    y = net(x)\n"
    wrapped = Fix("    y = net(x)", "    with torch.no_grad():\n        y = net(x)")
    assert apply_fix(twice, wrapped, 5).splitlines()[1:3] == ["    y = net(x)", "    y.sum().backward()"]
    assert apply_fix(twice, wrapped, 5).splitlines()[4] == "    with torch.no_grad():"
    assert apply_fix(twice, wrapped, 2).splitlines()[1] == "    with torch.no_grad():"
    assert apply_fix(twice, wrapped).splitlines()[1] == "    with torch.no_grad():"  # no line: the first


# -- fixes that fit the code (issue 25, a user's first hour) ---------------------------------

ARGS_SCRIPT = '''\
import argparse
import torch
from torch.utils.data import DataLoader

WORKERS = 0
parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()
a = DataLoader(ds, batch_size=32, num_workers=args.workers)
b = DataLoader(ds, num_workers=WORKERS)
c = DataLoader(ds, num_workers=cfg.workers)
d = DataLoader(ds, num_workers=0)
'''
WORKERS_SET = {"callee": "DataLoader", "set": {"num_workers": "4", "persistent_workers": "True"}}


def _fix(tmp_path: Path, source: str, kind: str, line: int, params: dict):
    from perfdoctor.model import Location
    from perfdoctor.rules.fixes import apply_fix, render_fix

    path = tmp_path / "train.py"
    path.write_text(source)
    f = render_fix(kind, Location(str(path), line), params)
    if f is not None and f.before:
        new = apply_fix(source, f)
        assert new is not None
        compile(new, "train.py", "exec")
    return f


def test_pd002_fix_never_overwrites_the_scripts_own_flag_or_setting(tmp_path: Path) -> None:
    f = _fix(tmp_path, ARGS_SCRIPT, "call-kwargs", 9, WORKERS_SET)
    assert f.before == 'parser.add_argument("--workers", type=int, default=0)'
    assert f.after == 'parser.add_argument("--workers", type=int, default=4)'
    assert "--workers" in f.note and "persistent_workers=True" in f.note
    f = _fix(tmp_path, ARGS_SCRIPT, "call-kwargs", 10, WORKERS_SET)
    assert (f.before, f.after) == ("WORKERS = 0", "WORKERS = 4")
    f = _fix(tmp_path, ARGS_SCRIPT, "call-kwargs", 11, WORKERS_SET)  # cfg is no argparse result: words for it
    assert f.after == "c = DataLoader(ds, num_workers=cfg.workers, persistent_workers=True)"
    assert "num_workers comes from `cfg.workers`: give it 4" in f.note
    f = _fix(tmp_path, ARGS_SCRIPT, "call-kwargs", 11, {"callee": "DataLoader", "set": {"num_workers": "4"}})
    assert (f.before, f.after) == ("", "") and "give it 4" in f.note  # words alone
    f = _fix(tmp_path, ARGS_SCRIPT, "call-kwargs", 12, WORKERS_SET)  # a constant in the call: replaced there
    assert f.after == "d = DataLoader(ds, num_workers=4, persistent_workers=True)"


def test_pd008_fix_is_against_the_flagged_line(tmp_path: Path) -> None:
    src = "for x, y in loader:\n    acc = (model(x).argmax(1) == y).float().mean().item()\n    print(loss.item())\n"
    f = _fix(tmp_path, src, "defer-host-read", 2, {})
    assert f.before == "    acc = (model(x).argmax(1) == y).float().mean().item()"
    assert f.after == "    acc = (model(x).argmax(1) == y).float().mean().detach()" and not f.example
    assert "`acc` stays a tensor" in f.note
    assert _fix(tmp_path, src, "defer-host-read", 3, {}) is None  # a print needs the number: words instead
    from perfdoctor.rules.catalog import load_rules

    pd008 = next(r for r in load_rules() if r.id == "PD008")
    assert "after" not in pd008.fix_text and "running_loss" not in pd008.fix_text.get("note", "")


PD016_SCRIPT = '''\
import torch
import torch.nn as nn


def make_layers(cfg):
    layers = []
    for v in cfg:
        layers.append(nn.Conv2d(3, v, 3))
    return nn.Sequential(*layers)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3)
'''


def test_pd016_fix_goes_at_module_level_never_in_init_or_a_loop(tmp_path: Path) -> None:
    params = {"statement": "torch.backends.cudnn.benchmark = True"}
    f = _fix(tmp_path, PD016_SCRIPT, "insert-before", 8, params)  # inside make_layers' for loop
    assert (f.before, f.after) == ("def make_layers(cfg):", "torch.backends.cudnn.benchmark = True\ndef make_layers(cfg):")
    f = _fix(tmp_path, PD016_SCRIPT, "insert-before", 15, params)  # inside Net.__init__
    assert f.after == "torch.backends.cudnn.benchmark = True\nclass Net(nn.Module):"
    from perfdoctor.rules.catalog import load_rules

    pd016 = next(r for r in load_rules() if r.id == "PD016")
    assert "after" not in pd016.fix_text  # where the source cannot be read: words, no generic snippet
