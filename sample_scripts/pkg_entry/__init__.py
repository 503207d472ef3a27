"""Capture robustness: a training package run with `perfdoctor run -m pkg_entry` (from sample_scripts/)."""
