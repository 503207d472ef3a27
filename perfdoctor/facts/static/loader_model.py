"""The model beside the loader (PD025): on each `dataloader` subject of this file, the parameter
count of the largest model the run measured (`dataloader.model_params`, copied from the run's
`model` subjects with the run as its source). A batch of a few samples through a small model is
launch-bound on any GPU; through a large one it is not.

The loader beside an evaluation (PD019, `eval_batch`, once every file is read): the batch an
eval-mode forward would get by default, where the run gave it a smaller one."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex


def detect(index: SourceIndex, facts: Facts) -> None:
    params = [p.value for m in facts.of_kind("model") if (p := m.facts.get("model.params")) is not None]
    if not params:
        return
    for s in facts.of_kind("dataloader"):
        if s.key.rsplit(":", 1)[0] == index.file:
            s.add("model_params", max(params), "count", "run", "parameters of the largest model the run saw")


def eval_batch(facts: Facts) -> None:
    """`eval_grad.default_batch` on each line the run measured calling a module in eval mode with
    grad mode on: the default batch (`dataloader.default_batch_size`, the default of the option its
    batch_size reads) of the one evaluation loader whose batch in this run was the calls' batch
    (`eval_grad.batch`), where that default is larger. A CPU run is often given a small test batch
    (`--test-batch-size 64` of a default 1000): what autograd saves per call grows with the batch.
    None where no loader or several with different defaults match (no way to tell which fed it)."""
    loaders = [s.facts for s in facts.of_kind("dataloader")
               if not (s.facts.get("dataloader.trains") is not None and s.facts["dataloader.trains"].value is True)]
    for s in facts.of_kind("eval_grad"):
        batch = s.facts.get("eval_grad.batch")
        if batch is None or not isinstance(batch.value, int) or batch.value <= 0:
            continue
        defaults = {f["dataloader.default_batch_size"].value for f in loaders
                    if "dataloader.default_batch_size" in f and (ran := f.get("dataloader.batch_size")) is not None
                    and ran.source != "static" and ran.value == batch.value}
        if len(defaults) == 1:
            (default,) = defaults
            if isinstance(default, int) and default > batch.value:
                s.add("default_batch", default, "count", "static",
                      f"the default batch of the evaluation loader that gave these calls {batch.value} samples in this run")
