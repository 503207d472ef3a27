"""The CI gate: baselines, comparisons and verdicts (never imports torch or numpy)."""

from perfdoctor.gate.baseline import (
                                      Baseline,
                                      RunRecord,
                                      load_baseline,
                                      noise_floor,
                                      record_from_report,
                                      record_from_run_dir,
                                      save_baseline,
                                      warmup_steps,
)
from perfdoctor.gate.compare import SCHEMA as COMPARE_SCHEMA
from perfdoctor.gate.compare import Comparison, Row, compare, compare_files, load_side

__all__ = ["COMPARE_SCHEMA", "Baseline", "Comparison", "Row", "RunRecord", "compare",
           "compare_files", "load_baseline", "load_side", "noise_floor", "record_from_report",
           "record_from_run_dir", "save_baseline", "warmup_steps"]
