"""Names a file gets through `from module import *` of a module of the same project."""

from __future__ import annotations

import textwrap
from pathlib import Path

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static import analyse_files

# a training loop and its validation under torch.no_grad(), after the line that star-imports `torch`
TRAIN = """
def validation(model, loader):
    model.eval()
    for image in loader:
        with torch.no_grad():
            output = model(image)

def train(model, loader, opt):
    for image in loader:
        model(image).sum().backward()
        opt.step()
    validation(model, loader)

for epoch in range(3):
    train(net, data, sgd)
"""


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def test_torch_bound_by_a_star_import_is_torch(tmp_path):
    # jfzhang95/pytorch-deeplab-xception's train.py: no `import torch` of its own, `torch` comes with
    # `from modeling.deeplab import *`; its validation's `with torch.no_grad():` is a no_grad all the same
    _write(tmp_path / "modeling" / "__init__.py", "")
    _write(tmp_path / "modeling" / "deeplab.py", """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from ._private import helper as _helper

        class DeepLab(nn.Module):
            pass
        """)
    script = _write(tmp_path / "train.py", "from modeling.deeplab import *\n" + TRAIN)
    facts = Facts()
    analyse_files([script], facts)
    assert facts.of_kind("eval_grad") == []


def test_a_star_import_of_a_module_with_all_exports_only_those(tmp_path):
    _write(tmp_path / "helpers.py", """\
        import torch
        __all__ = ["run"]

        def run():
            pass
        """)
    script = _write(tmp_path / "train.py", "from helpers import *\n" + TRAIN)
    facts = Facts()
    analyse_files([script], facts)
    # `torch` is not among helpers' exports: the name is unbound here, nothing to call it no_grad by
    assert [s.locations[0].line for s in facts.of_kind("eval_grad")] == [7]
