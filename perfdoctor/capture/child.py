"""The child process: `python -m perfdoctor.capture.child --run-dir D [--steps N] [--module] TARGET -- ARGS`.

Sets up `sys.argv` and `sys.path` as `python TARGET ARGS` (or `python -m TARGET ARGS`) would,
installs the probes, runs the script as `__main__` (so spawn-started DataLoader workers find
classes defined in it) and always finalises the run folder, whatever way the script ends.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the perfdoctor package


def parse_args(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"steps": None, "module": False, "window": None}
    rest = list(argv)
    while rest and rest[0].startswith("--") and rest[0] != "--":
        flag = rest.pop(0)
        if flag == "--run-dir":
            opts["run_dir"] = rest.pop(0)
        elif flag == "--steps":
            opts["steps"] = int(rest.pop(0))
        elif flag == "--window":
            opts["window"] = tuple(int(x) for x in rest.pop(0).split(","))
        elif flag == "--module":
            opts["module"] = True
        else:
            raise SystemExit(f"perfdoctor child: unknown option {flag}")
    opts["target"] = rest.pop(0)
    if rest and rest[0] == "--":
        rest.pop(0)
    opts["args"] = rest
    return opts


def _ours(filename: str) -> bool:
    return (filename in (runpy.__file__, "<frozen runpy>")
            or os.path.abspath(filename).startswith(_HERE + os.sep))


def format_exception(e: BaseException) -> str:
    """The traceback as Python would print it for the script (runpy and perfdoctor frames hidden)."""
    te = traceback.TracebackException(type(e), e, e.__traceback__)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not _ours(f.filename)])
    return "".join(te.format())


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    run_dir = Path(opts["run_dir"])
    target, module = opts["target"], opts["module"]
    script = None if module else os.path.abspath(target)
    if script is None:
        sys.argv = [target, *opts["args"]]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = [target, *opts["args"]]
        sys.path[0] = os.path.dirname(script)

    from perfdoctor.capture import env as envmod
    from perfdoctor.capture.writer import write_meta
    from perfdoctor.contracts.run import SCHEMA, Exit, Meta

    meta = Meta(schema=SCHEMA, script=script, module=target if module else None, argv=list(sys.argv),
                cwd=os.getcwd(), started=datetime.now().astimezone().isoformat(timespec="seconds"), wall_s=None,
                exit=Exit(code=None, reason="killed", traceback=None), step_clock="none", window=None,
                env=envmod.base_env(), complete=False)
    write_meta(run_dir, meta)

    import torch

    from perfdoctor import usercode
    from perfdoctor.capture import window
    from perfdoctor.capture.clock import StepsReached
    from perfdoctor.capture.recorder import Recorder

    usercode.reset_cache()  # torch is imported now: its folder joins the excluded prefixes
    meta.env.torch = str(torch.__version__)
    write_meta(run_dir, meta)
    rec = Recorder(torch, run_dir, meta, steps_limit=opts["steps"], window=window.plan(opts["steps"], opts["window"]))
    try:
        rec.install()
    except Exception as e:  # noqa: BLE001 - a probe we cannot install must not stop the script
        rec.errors("install", e)
        print(f"perfdoctor: some probes could not be installed ({type(e).__name__}: {e})", file=sys.stderr)

    code, reason, tb = 0, "completed", None
    try:
        if script is None:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except StepsReached:
        reason = "steps-reached"
    except SystemExit as e:
        code, reason = _exit_code(e), "sys-exit"
    except KeyboardInterrupt as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code, reason, tb = 130, "interrupted", format_exception(e)
        sys.stderr.write(tb)
    except BaseException as e:  # noqa: BLE001 - whatever the script raises, the run folder is written
        code, reason, tb = 1, "exception", format_exception(e)
        sys.stderr.write(tb)
    if rec.stopping:  # finalised when --steps was reached; the script may have done more after
        code, reason = 0, "steps-reached"
    rec.finalise(reason, code, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
