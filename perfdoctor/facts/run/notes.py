"""meta.json -> the notes a run's report opens with: a timing-only capture, a distributed job the script started itself,
how the steps were counted, how the script ended, what became of the profiler's window, too few
steady steps; and `needs_a_gpu`, the note for a script that failed for want of a GPU."""

from __future__ import annotations

import os
import re
from typing import Any

from perfdoctor.contracts.report import SummaryDoc
from perfdoctor.contracts.run import ChildProcessRecord, Stuck, StuckProcess, exception_line
from perfdoctor.facts.run.context import RunContext
from perfdoctor.usercode import is_user_file


def children_sentence(children: list[ChildProcessRecord]) -> str:
    """No step in the process perfdoctor ran, which started processes of its own: where, and running what."""
    n = sum(c.started for c in children)
    first = children[0]
    where = f" at {os.path.basename(first.site.file)}:{first.site.line}" if first.site is not None else ""
    how = f"{first.target}, {first.method} start" if first.method != "default" else first.target
    return (f"no steps found in the process perfdoctor ran: the script started {n} process{'es' if n != 1 else ''} "
            f"itself{where} ({how}) and presumably trained there; perfdoctor profiles the process it runs, not "
            "those. To diagnose the training, run it in this process (call the function directly, with one "
            "process), or, for a distributed job, launch its ranks with `perfdoctor run --nproc-per-node N` "
            "from a script that reads torchrun's environment (RANK, WORLD_SIZE).")


def add(ctx: RunContext) -> None:
    notes, clock, exit_, win, profiled = ctx.notes, ctx.clock, ctx.exit, ctx.window, ctx.profiled
    world = max((d.world_size for d in ctx.probes.ddp), default=0)
    if ctx.rank is None and world > 1:
        # the script started the other ranks itself (Lightning's launcher, mp.spawn): they ran bare
        notes.append(f"the script started a distributed job of {world} processes itself (DistributedDataParallel "
                     f"over {world} ranks; Lightning's and mp.spawn's launchers do so): this report measures "
                     "the process perfdoctor ran, the other ranks ran without perfdoctor"
                     + (", and --steps ended this process alone (the others then lose their peer)"
                        if exit_.reason == "steps-reached" else "")
                     + f". To measure every rank, launch them with perfdoctor: `perfdoctor run --nproc-per-node "
                     f"{world} SCRIPT` (Lightning then runs under torchrun's ranks).")
    if ctx.raw_meta.get("capture") == "timing":
        notes.append("a timing-only capture (perfdoctor verify's: the step clock and the first losses; no probes, "
                     "no profiler): its step times are measured, its problems are not; `perfdoctor run` finds them")
    n = len(ctx.run_steps) if clock != "whole-run" else 0
    if clock == "backward":
        notes.append("no optimizer step seen: steps counted by backward() calls")
    elif clock == "dataloader":
        notes.append("no optimizer step or backward() seen: steps counted by DataLoader batches")
    elif clock == "whole-run" and not ctx.ended_early:
        notes.append(children_sentence(ctx.probes.children) if ctx.probes.children else
                     "no steps found (no optimizer step, backward() or DataLoader batch): the whole run is one span")
    reason, code = exit_.reason, exit_.code
    after = "before its first step ended" if ctx.ended_early else f"after {n} steps"
    if reason == "exception":
        notes.append(f"the script failed {after}: {failure_line(exit_.traceback)}")
    elif reason == "sys-exit" and code:
        notes.append(f"the script exited with code {code} {after}")
    elif reason == "killed":
        notes.append(f"the script was killed (exit code {code}) {after if ctx.ended_early else f'after about {n} steps'}: "
                     "probes and profile were not saved")
    elif reason == "interrupted":
        notes.append(f"interrupted {after}")
    if ctx.stuck is not None:
        ctx.summary.stuck = ctx.stuck
        notes.insert(0, stuck_sentence(ctx.stuck))
    if win is not None and clock != "whole-run":
        if win.stopped_by == "time":
            notes.append(f"profiler window stopped at its time budget ({win.budget_s or 0:g} s) in step {win.last_step}: "
                         f"{profiled} of {win.active} steps recorded, the run went on unprofiled")
        elif win.stopped_by == "user-profiler":
            notes.append(f"the script started a torch.profiler of its own after step {win.last_step}: perfdoctor's "
                         f"profiler window stepped aside there (one profiler runs at a time), {profiled} of "
                         f"{win.active} steps recorded")
        elif win.stopped_by == "events":
            notes.append(f"profiler window shortened to its event budget ({win.budget_events or 0:,} trace events, "
                         f"about {win.events_per_step or 0:,} per step estimated): {profiled} of {win.active} steps recorded")
        elif not profiled and not win.trace:
            notes.append(f"profiler window not reached: the run ended after {n} steps, the window starts "
                         f"after step {win.skip}")
        elif not win.completed:
            notes.append(f"profiler window incomplete: {profiled} of {win.active} steps recorded")
    if win is not None and win.user_profile_hook:
        notes.append("the script set a profile hook of its own (sys.setprofile): it was left in place, so "
                     "perfdoctor recorded no Python calls (no hot functions, no source lines in the trace)")
    if win is not None and win.error:
        notes.append(f"the profiler failed: {win.error}")
    if ctx.steady and len(ctx.steady) < 5 and clock != "whole-run":
        notes.append(f"only {len(ctx.steady)} steady-state steps: timings are rough")


_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)


def failure_line(traceback: str | None) -> str:
    """The exception of a traceback and where it was raised (its last `File "...", line N`: for a
    SyntaxError, the line that does not parse): `SyntaxError: invalid syntax (syn.py:3)`."""
    text = (traceback or "").strip()
    last = exception_line(text)  # not the last line: a multi-line message ends jit.trace's graph diff
    where = list(_FILE_LINE.finditer(text))
    return last + (f" ({os.path.basename(where[-1]['file'])}:{where[-1]['line']})" if where else "")


def _stuck_frame(p: StuckProcess) -> str:
    """A process's innermost frame in the user's code (else its innermost frame) as `file:line in function`."""
    frame = next((f for f in p.frames if is_user_file(f.file)), p.frames[0] if p.frames else None)
    if frame is None:
        return "no Python frame"
    return f"{os.path.basename(frame.file)}:{frame.line} in {frame.function}"


def stuck_sentence(stuck: Stuck) -> str:
    """Where a script that ended no step was, from stuck.json: the training process's main thread,
    then the processes under it (DataLoader workers), by place."""
    main = [p for p in stuck.processes if p.role == "main"]
    others: dict[str, int] = {}
    for p in stuck.processes:
        if p.role != "main":
            others[_stuck_frame(p)] = others.get(_stuck_frame(p), 0) + 1
    text = f"no step ended: after {stuck.after_s:g} s the script was still before its first step"
    if main:
        text += f"; its main thread was at {_stuck_frame(main[0])}"
        if any("torch/utils/data/" in f.file and "__next__" in f.function for f in main[0].frames):
            text += " (waiting for a DataLoader batch)"
    if others:
        text += "; the processes under it (DataLoader workers) were at " + ", ".join(
            where + (f" ({n} processes)" if n > 1 else "") for where, n in others.items())
    return text + " (py-spy dump; stuck.json in the run folder has the stacks)"


# the last line of a traceback when CUDA (or NCCL, which needs it) is asked for on a machine without it
_NO_GPU = re.compile(r"CUDA|NCCL|_cuda_|accelerator device|NVIDIA driver", re.IGNORECASE)


def needs_a_gpu(meta: dict[str, Any], summary: SummaryDoc) -> str | None:
    """A note where the script failed before its first step on a machine without a GPU because it asks
    for one (its error names CUDA, NCCL or the accelerator): a report of nothing measured must not
    read as a clean bill of health. None otherwise."""
    exit_ = meta.get("exit") or {}
    if exit_.get("reason") != "exception" or (meta.get("env") or {}).get("device") == "cuda":
        return None
    if summary.steps_profiled:
        return None
    if not _NO_GPU.search(exception_line(exit_.get("traceback"))):
        return None
    return ("the script needs a GPU and this machine has none: it failed before its first step, so nothing was "
            "measured and only its source was read. Run it on a GPU machine, or let it fall back to the CPU where "
            "CUDA is missing (device = \"cuda\" if torch.cuda.is_available() else \"cpu\", and the \"gloo\" "
            "backend for torch.distributed)")
