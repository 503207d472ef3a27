"""Global facts from the source about how the GPU will run the model (PD016, PD022, PD023):
`cudnn.benchmark` and `cudnn.deterministic` as the files set them (to a constant, to a user's setting:
`= args.benchmark`, or through Lightning's `Trainer(benchmark=...)`), whether they enter autocast
(`autocast.in_source`), use `torch.channels_last` (`layout.channels_last`), or give a DataLoader a
`collate_fn` (`data.custom_collate`: batches that may change shape). Each is the union over the
files: a file that sets a flag True raises an earlier file's static False, and a value from another
source is kept."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.dataloader import DATALOADER
from perfdoctor.facts.static.index import SourceIndex
from perfdoctor.facts.static.index.frameworks import LIGHTNING_TRAINERS
from perfdoctor.facts.static.index.settings import setting
from perfdoctor.facts.static.index.syntax import kwarg

AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast",
                      "torch.amp.autocast_mode.autocast"})
CHANNELS_LAST = frozenset({"torch.channels_last", "torch.channels_last_3d"})
_FLAGS = {"torch.backends.cudnn.benchmark": "cudnn.benchmark",
          "torch.backends.cudnn.deterministic": "cudnn.deterministic"}


def _union(facts: Facts, name: str, value: bool, detail: str) -> None:
    prior = facts.get(name)
    if prior is not None and (prior.source != "static" or prior.value):
        return
    if prior is None or value:
        facts.add(name, value, source="static", detail=detail)


def _value(index: SourceIndex, value: ast.expr) -> bool:
    """What an assignment sets a flag to by default: a constant as written; a user's setting
    (`= args.benchmark`, `= not args.deterministic`, `= cfg.CUDNN_BENCHMARK`) as it is unless the user
    changes it, a device test (`= torch.cuda.is_available()`) on for the GPU the script targets. Either
    way the flag is set: the user chose it."""
    if isinstance(value, ast.Constant):
        return bool(value.value)
    on = setting(index, value)
    return True if on is None else on


def detect(index: SourceIndex, facts: Facts) -> None:
    flags: dict[str, bool] = {}
    for node in index.nodes:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                name = _FLAGS.get(index.qual(t) or "")
                if name:
                    flags[name] = flags.get(name, False) or _value(index, node.value)
    for call in index.calls:
        qual = index.qual(call.func)
        if qual == "torch.use_deterministic_algorithms" and call.args and \
                isinstance(call.args[0], ast.Constant) and call.args[0].value is True:
            flags["cudnn.deterministic"] = True
        if qual in LIGHTNING_TRAINERS:  # Trainer(benchmark=True) sets cudnn.benchmark for the run
            for kw, name in (("benchmark", "cudnn.benchmark"), ("deterministic", "cudnn.deterministic")):
                if (v := kwarg(call, kw)) is not None and not (isinstance(v, ast.Constant) and v.value is None):
                    flags[name] = flags.get(name, False) or _value(index, v)
    for name, value in flags.items():
        # only where a file sets the flag: absent means torch's default (off)
        _union(facts, name, value, f"set to {value} in the source")
    autocast = any(index.qual(c.func) in AUTOCAST for c in index.calls)
    _union(facts, "autocast.in_source", autocast,
           "the files enter torch.autocast" if autocast else "no torch.autocast in the files")
    channels_last = any(isinstance(n, ast.Attribute) and index.qual(n) in CHANNELS_LAST for n in index.nodes)
    _union(facts, "layout.channels_last", channels_last,
           "torch.channels_last in the files" if channels_last else "no torch.channels_last in the files")
    collate = any(index.qual(c.func) in DATALOADER and kwarg(c, "collate_fn") is not None for c in index.calls)
    _union(facts, "data.custom_collate", collate,
           "a DataLoader is given a collate_fn" if collate else "no DataLoader is given a collate_fn")
