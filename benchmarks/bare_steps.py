"""Run a training script bare (plain Python, no perfdoctor capture, no profiler) and record when its
optimizer steps end: the independent measurement `verify_savings.py --twin` compares verify with.

    python benchmarks/bare_steps.py OUT.json STEPS SCRIPT [ARGS...]

A global optimizer step hook (torch.optim.optimizer.register_optimizer_step_post_hook) notes
time.perf_counter() after each step of the first optimizer that steps (a GAN's second optimizer is left
out, so one note is one training step); after STEPS + 1 notes the times are written to OUT.json and the
process ends (os._exit: the script's own teardown is not timed, and its later epochs are not waited
for). A script that ends sooner writes what it noted. Nothing in the script is changed. A rank of a
distributed job (RANK set, torch.distributed.run) other than rank 0 writes OUT.json.rank-R, rank 0
OUT.json.rank-0 (verify_savings reads them all).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time


def main() -> None:
    out, limit, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if os.environ.get("RANK", "").isdigit() and os.environ.get("WORLD_SIZE", "1") != "1":
        out = f"{out}.rank-{os.environ['RANK']}"
    sys.argv = sys.argv[3:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    import torch.optim.optimizer as optim

    times: list[float] = []
    first: list[int] = []

    def write() -> None:
        with open(out, "w") as f:
            json.dump({"step_end_s": times}, f)

    def hook(opt: object, args: object, kwargs: object) -> None:
        if not first:
            first.append(id(opt))
        if id(opt) != first[0]:
            return
        times.append(time.perf_counter())
        if len(times) > limit:
            write()
            sys.stdout.flush()
            os._exit(0)

    optim.register_optimizer_step_post_hook(hook)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        write()


if __name__ == "__main__":
    main()
