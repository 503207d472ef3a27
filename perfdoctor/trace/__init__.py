"""Load torch.profiler Chrome traces (every dialect, one file or a folder of ranks)."""

from perfdoctor.trace.loader import load_trace, load_traces, settle_ranks, trace_files
from perfdoctor.trace.model import Trace

__all__ = ["Trace", "load_trace", "load_traces", "settle_ranks", "trace_files"]
