"""PD030 (rules/PD030-no-distributed-sampler.toml), judged on hand-built facts: fires on a job's unsharded loader only.

a real job end to end: tests/analysis/test_distributed.py."""

from __future__ import annotations

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge


@pytest.mark.parametrize("world, sharded, fires", [(2, False, True), (2, True, False), (None, False, False),
                                                   (1, False, False)])
def test_pd030_fires_on_an_unsharded_loader_of_a_job_only(world, sharded, fires):
    from perfdoctor.model import Location

    f = Facts()
    if world is not None:
        f.add("run.world_size", world, "count")
    s = f.subject("dataloader", "/x/train.py:10")
    s.locations.append(Location("/x/train.py", 10, "loader = DataLoader(ds, shuffle=True)"))
    s.add("sampler", "DistributedSampler" if sharded else "RandomSampler")
    s.add("sharded", sharded)
    s.add("batches", 20, "count")
    found = [x for x in judge(f, [r for r in load_rules() if r.id == "PD030"]) if x.rule == "PD030"]
    assert bool(found) is fires
    if fires:
        assert "2 ranks" in found[0].title and "RandomSampler" in found[0].title
