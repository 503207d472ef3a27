"""The runtime probes (run in the child; import torch through their caller), one per subject.

Each probe is a small class: `install()` patches torch (or registers hooks), `uninstall()` puts
everything back, `records()` gives what it saw as the run-folder contracts of probes.json
(`perfdoctor.contracts.run`). Every probe is O(1) per call; its errors go to the run's error log,
never into the user's script. The step clock (`capture/clock.py`) and the coordinator
(`capture/recorder.py`) drive the few that have per-step work.
"""
