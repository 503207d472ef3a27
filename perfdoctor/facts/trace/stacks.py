"""Python stacks in a trace -> the user's file:line for a CPU event.

torch.profiler records Python frames either as `python_function` events (with_stack=True in
recent versions: nested spans on the CPU tracks, each naming `file(line): function`, chained to its
caller by id) or, in legacy traces, as a `Call stack` string on the op itself. Either way the
answer is the innermost frame that is the user's code (`user_frame`).
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_right
from collections import defaultdict

from perfdoctor.model import Location
from perfdoctor.trace.model import PYFUNC, Trace

_FRAME = re.compile(r"^(.*?)\((\d+)\): (.*)$")
START_SLACK_US = 1.0  # a frame that begins this close to the first Python event was running at the profiler's start
Frame = tuple[str, int, str]  # (file, line, function)


def is_stdlib(path: str) -> bool:
    """torch.profiler names standard-library frames by a short path (`threading.py`,
    `multiprocessing/queues.py`): its first part is a standard-library module."""
    first = path.replace("\\", "/").split("/", 1)[0]
    return first.removesuffix(".py") in sys.stdlib_module_names


def user_frame(frame: str) -> Frame | None:
    """(file, line, function) of a profiler frame name `file(line): function`, or None where the
    file is not the user's: torch, perfdoctor, `<...>` pseudo-files, site-/dist-packages, an
    installed Python's library (`/usr/lib`, `/lib/python`) or the standard library."""
    m = _FRAME.match(frame.strip())
    if not m:
        return None
    f = m.group(1)
    if (f.startswith(("torch/", "perfdoctor/", "<", "/usr/lib")) or "site-packages" in f or "dist-packages" in f
            or "/lib/python" in f or "/torch/" in f or is_stdlib(f)):
        return None
    return f, int(m.group(2)), m.group(3)


def _between(frame: str) -> bool:
    """A frame that may lie between a user's call and the op it made: a C function's
    (`<built-in method randn of type object at 0x...>`) or perfdoctor's own probe wrapping it."""
    frame = frame.lstrip()
    return frame.startswith(("<built-in", "perfdoctor/"))


def _legacy_frame(stack: str, direct: bool) -> tuple[Frame, int] | None:
    """Stacks.frame for a legacy `Call stack` string (frames innermost first, `;`-separated)."""
    for fr in stack.split(";"):
        if u := user_frame(fr):
            return u, -1
        if direct and fr.strip() and not _between(fr):
            return None
    return None


def location(u: Frame) -> tuple[str, Location]:
    """The subject key ("file:line") and the Location of a user frame."""
    return f"{u[0]}:{u[1]}", Location(file=u[0], line=u[1], function=u[2])


class Stacks:
    """The user's file:line for a CPU event, from python_function events or legacy `Call stack`."""

    def __init__(self, t: Trace):
        self.t = t
        self.by_track: dict[int, list[int]] = defaultdict(list)
        self.by_id: dict[int, int] = {}
        track, ext = t.track, t.ext
        for i in t.indices(PYFUNC):
            self.by_track[track[i]].append(i)
            if ext[i] >= 0:  # -1: the trace gave no Python id (then the event has no known caller)
                self.by_id[ext[i]] = i
        for lst in self.by_track.values():
            lst.sort(key=t.ts.__getitem__)
        # the frames already running when the profiler started are recorded as starting with it, named
        # by the line they were at then (the `prof.step()` or `opt.step()` that started it): such a
        # frame's line is the profiler's start, no location of anything inside it
        self.start = min((t.ts[lst[0]] for lst in self.by_track.values() if lst), default=None)
        self.starts = {k: [t.ts[i] for i in v] for k, v in self.by_track.items()}
        self._named: dict[int, Frame | None] = {}  # string index -> user_frame
        self._legacy: dict[tuple[int, bool], tuple[Frame, int] | None] = {}  # (call stack, direct) -> frame

    def named_frame(self, si: int) -> Frame | None:
        """user_frame of t.strings[si], cached (the same frames and stacks repeat every step)."""
        if si not in self._named:
            self._named[si] = user_frame(self.t.strings[si])
        return self._named[si]

    def chain(self, i: int) -> list[int]:
        """The python events around event i, innermost first (empty where the trace has no Python stack there)."""
        t = self.t
        lst = self.by_track.get(t.track[i])
        if not lst:
            return []
        ts = t.ts[i]
        j = bisect_right(self.starts[t.track[i]], ts) - 1
        for _ in range(5000):
            if j < 0:
                return []
            if t.ts[lst[j]] + t.dur[lst[j]] >= ts:
                break
            j -= 1
        else:
            return []
        out: list[int] = []
        p: int | None = lst[j]
        while p is not None and p not in out and len(out) < 500:
            out.append(p)
            p = self.by_id.get(t.corr[p])
        return out

    def frame(self, i: int, direct: bool = False) -> tuple[Frame, int] | None:
        """(file, line, function) of the innermost user frame around event i, and an id of that
        frame's invocation (python event index, or -1 for legacy call stacks). With `direct`, only a
        user frame that made the call itself, through built-ins (`torch.tensor`, `Tensor.to`) and
        perfdoctor's probes alone, not one that called a library that made it (an optimizer's own `torch.tensor(1.0)`)."""
        t = self.t
        cs = t.call_stack.get(i)
        if cs is not None:
            if (cs, direct) not in self._legacy:
                self._legacy[(cs, direct)] = _legacy_frame(t.strings[cs], direct)
            return self._legacy[(cs, direct)]
        lst = self.by_track.get(t.track[i])
        if not lst:
            return None
        ts = t.ts[i]
        j = bisect_right(self.starts[t.track[i]], ts) - 1
        for _ in range(5000):  # the latest-starting python event that contains ts is the innermost
            if j < 0:
                return None
            p = lst[j]
            if t.ts[p] + t.dur[p] >= ts:
                break
            j -= 1
        else:
            return None
        caller: int | None = p
        seen: set[int] = set()  # a hostile or broken trace may chain ids into a cycle (an event its own parent)
        while caller is not None and caller not in seen:
            seen.add(caller)
            u = self.named_frame(t.name[caller])
            if u:
                return None if self.start is not None and t.ts[caller] <= self.start + START_SLACK_US else (u, caller)
            if direct and not _between(t.strings[t.name[caller]]):
                return None
            caller = self.by_id.get(t.corr[caller])
        return None
