"""The run folder's JSON files, written from the contracts in `perfdoctor.contracts.run` (runs in
the child and in the parent; never imports torch).

meta.json is written when the child starts and rewritten at the end; steps.partial.jsonl gets the
steps as they happen (every half second: the parent's status line reads it, and turns it into
steps.json if the child dies); steps.json, probes.json and hotspots.json are written at the end.
Every file but the partial one is replaced atomically: a reader never sees half a file.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from msgspec import UNSET

from perfdoctor.contracts.run import ClockLine, CudaMem, Hotspots, Meta, Probes, Step, Steps, encode

PARTIAL = "steps.partial.jsonl"


def write(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(encode(obj))
    tmp.replace(path)


def write_meta(run_dir: Path, meta: Meta) -> None:
    write(run_dir / "meta.json", meta)


def step_row(s: tuple) -> Step:
    """The step clock's tuple (i, end s, wall s, data, forward, backward, optimizer, RSS, CUDA
    memory per device or None; times in ms but the end) as written."""
    cuda = s[8]
    return Step(i=s[0], end_s=round(s[1], 6), wall_ms=round(s[2], 4), data_ms=round(s[3], 4),
                forward_ms=round(s[4], 4), backward_ms=round(s[5], 4), optimizer_ms=round(s[6], 4),
                mem_bytes=s[7], cuda_mem=UNSET if cuda is None else
                [CudaMem(device=d, allocated=a, peak=p) for d, (a, p) in sorted(cuda.items())])


class RunWriter:
    """The child's writer: the partial steps through the run, the other files at the end."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._partial = open(run_dir / PARTIAL, "wb")
        self._encode = msgspec.json.Encoder().encode

    def restart_steps(self, clock: str) -> None:
        """A step clock took over: the partial steps start again, under its name."""
        self._partial.seek(0)
        self._partial.truncate()
        self._partial.write(self._encode(ClockLine(clock=clock)) + b"\n")

    def append_steps(self, steps: list[tuple]) -> None:
        self._partial.write(b"".join(self._encode(step_row(s)) + b"\n" for s in steps))
        self._partial.flush()

    def hotspots(self, hotspots: Hotspots) -> None:
        write(self.run_dir / "hotspots.json", hotspots)

    def finish(self, steps: list[tuple], probes: Probes, meta: Meta) -> None:
        """steps.json, probes.json, then meta.json (complete); the partial steps go."""
        write(self.run_dir / "steps.json", Steps(steps=[step_row(s) for s in steps]))
        write(self.run_dir / "probes.json", probes)
        write_meta(self.run_dir, meta)
        try:
            self._partial.close()
            (self.run_dir / PARTIAL).unlink()
        except OSError:
            pass
