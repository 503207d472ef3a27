"""Capture: run a training script in a child process under probes and a profiled window.

Only the child (`child.py`, and the coordinator, clock, probes and window it builds) imports torch.
"""

from perfdoctor.capture.runner import RunResult, run_script

__all__ = ["RunResult", "run_script"]
