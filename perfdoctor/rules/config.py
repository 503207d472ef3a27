"""Per-project settings from `[tool.perfdoctor]` in the user's pyproject.toml, as ruff does:

```toml
[tool.perfdoctor]
select = ["PD"]            # rule ids or prefixes; default: all
ignore = ["PD005"]         # rule ids or prefixes
extend-rules = ["perf/rules"]   # folders of the project's own rule files (TOML)

[tool.perfdoctor.thresholds.PD002]
min_wait_fraction = 0.2
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor.errors import RuleError
from perfdoctor.rules.catalog import tomllib


@dataclass
class Settings:
    select: list[str] = field(default_factory=list)  # empty = all
    ignore: list[str] = field(default_factory=list)
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra_rule_dirs: list[Path] = field(default_factory=list)
    source: Path | None = None  # the pyproject.toml these came from

    def enabled(self, rule_id: str) -> bool:
        if self.select and not any(rule_id.startswith(s) for s in self.select):
            return False
        return not any(rule_id.startswith(i) for i in self.ignore)


def find_pyproject(start: Path) -> Path | None:
    start = start.resolve()
    for d in [start, *start.parents] if start.is_dir() else [start.parent, *start.parent.parents]:
        p = d / "pyproject.toml"
        if p.is_file():
            return p
    return None


def _str_list(v: Any, key: str, where: Path) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RuleError(f"{where}: [tool.perfdoctor] {key} must be a list of strings")
    return [x.strip().upper() if key != "extend-rules" else x for x in v]


def load_settings(start: Path | None) -> Settings:
    """Settings from the nearest pyproject.toml at or above `start` (the script's folder or the
    trace's), or defaults when there is none or it has no [tool.perfdoctor]."""
    if start is None:
        return Settings()
    path = find_pyproject(start)
    if path is None:
        return Settings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise RuleError(f"cannot read {path}: {e}") from None
    cfg = data.get("tool", {}).get("perfdoctor")
    if cfg is None:
        return Settings(source=path)
    if not isinstance(cfg, dict):
        raise RuleError(f"{path}: [tool.perfdoctor] must be a table")
    known = {"select", "ignore", "thresholds", "extend-rules"}
    unknown = set(cfg) - known
    if unknown:
        raise RuleError(f"{path}: unknown [tool.perfdoctor] setting(s): {', '.join(sorted(unknown))} "
                        f"(known: {', '.join(sorted(known))})")
    thresholds = cfg.get("thresholds", {})
    if not isinstance(thresholds, dict) or not all(isinstance(v, dict) for v in thresholds.values()):
        raise RuleError(f"{path}: [tool.perfdoctor.thresholds] must hold one table per rule id")
    return Settings(
        select=_str_list(cfg.get("select", []), "select", path),
        ignore=_str_list(cfg.get("ignore", []), "ignore", path),
        thresholds={k.upper(): dict(v) for k, v in thresholds.items()},
        extra_rule_dirs=[(path.parent / d).resolve() for d in _str_list(cfg.get("extend-rules", []),
                                                                         "extend-rules", path)],
        source=path,
    )
