"""Per-project settings from `[tool.perfdoctor]` in the user's pyproject.toml, as ruff does:

```toml
[tool.perfdoctor]
select = ["PD"]            # rule ids or prefixes; default: all
ignore = ["PD005"]         # rule ids or prefixes
extend-rules = ["perf/rules"]   # folders of the project's own rule files (TOML), inside the project

[tool.perfdoctor.thresholds.PD002]
min_wait_fraction = 0.2
```

Trust: the settings change what the CI gate checks, so they are read only from the project that
runs perfdoctor: `pyproject.toml` in the current directory, or the file `--config` names; never
from the folder of a trace or run being analysed (a `pyproject.toml` in a shared parent folder, a
temp directory say, would otherwise apply to every trace under it). `extend-rules` folders must lie
inside that project, a project rule may not reuse a built-in rule's id, thresholds must have the
type of the rule's own (finite numbers for numbers), and whatever the settings change is listed in
the report (`changes`): the rules they turn off, the thresholds they move, the rules they add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor.contracts import files
from perfdoctor.errors import InputError, RuleError
from perfdoctor.rules.catalog import Rule, builtin_rules_dir, tomllib

MAX_CONFIG_BYTES = 1 << 20  # a pyproject.toml bigger than this is refused
KNOWN = ("select", "ignore", "thresholds", "extend-rules")


@dataclass
class Settings:
    select: list[str] = field(default_factory=list)  # empty = all
    ignore: list[str] = field(default_factory=list)
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra_rule_dirs: list[Path] = field(default_factory=list)
    source: Path | None = None  # the pyproject.toml these came from
    # the project folder: the config's folder (the current directory by default); the only place,
    # with a run's own files, whose sources a finding's location may make perfdoctor read
    project: Path = field(default_factory=Path.cwd)

    def enabled(self, rule_id: str) -> bool:
        if self.select and not any(rule_id.startswith(s) for s in self.select):
            return False
        return not any(rule_id.startswith(i) for i in self.ignore)


def _str_list(v: Any, key: str, where: Path) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RuleError(f"{where}: [tool.perfdoctor] {key} must be a list of strings")
    return [x.strip().upper() if key != "extend-rules" else x for x in v]


def load_settings(config: Path | None = None, cwd: Path | None = None) -> Settings:
    """Settings from `config` (`--config FILE`: it must exist), else from `pyproject.toml` in `cwd`
    (the current directory) if there is one; defaults when it has no [tool.perfdoctor]."""
    cwd = Path.cwd() if cwd is None else cwd
    if config is None:
        path = cwd / "pyproject.toml"
        if not path.is_file():
            return Settings(project=cwd.resolve())
    else:
        path = config
        if not path.is_file():
            raise RuleError(f"--config {path}: no such file")
    path = path.resolve()
    try:
        raw = files.read_bytes(path, MAX_CONFIG_BYTES)  # a regular file only, never blocking, capped
    except InputError as e:
        raise RuleError(e.message) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise RuleError(f"cannot read {path}: {' '.join(str(e).split())[:200]}") from None
    return parse_settings(data, path)


def parse_settings(data: dict[str, Any], path: Path) -> Settings:
    """The [tool.perfdoctor] table of a parsed pyproject.toml at `path`, validated."""
    project = path.parent
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise RuleError(f"{path}: `tool` must be a table ([tool.perfdoctor])")
    cfg = tool.get("perfdoctor")
    if cfg is None:
        return Settings(source=path, project=project)
    if not isinstance(cfg, dict):
        raise RuleError(f"{path}: [tool.perfdoctor] must be a table")
    unknown = set(cfg) - set(KNOWN)
    if unknown:
        raise RuleError(f"{path}: unknown [tool.perfdoctor] setting(s): {', '.join(sorted(unknown))} "
                        f"(known: {', '.join(sorted(KNOWN))})")
    thresholds = cfg.get("thresholds", {})
    if not isinstance(thresholds, dict) or not all(isinstance(v, dict) for v in thresholds.values()):
        raise RuleError(f"{path}: [tool.perfdoctor.thresholds] must hold one table per rule id")
    dirs = []
    for d in _str_list(cfg.get("extend-rules", []), "extend-rules", path):
        if not d.strip():
            raise RuleError(f"{path}: extend-rules {d!r}: give a folder of rule files (a path inside the project)")
        p = Path(d)
        resolved = (project / p).resolve()
        if p.is_absolute() or not resolved.is_relative_to(project.resolve()):
            raise RuleError(f"{path}: extend-rules {d!r} must be a folder inside the project ({project}); "
                            f"absolute paths and `..` are not allowed")
        dirs.append(resolved)
    return Settings(
        select=_str_list(cfg.get("select", []), "select", path),
        ignore=_str_list(cfg.get("ignore", []), "ignore", path),
        thresholds={str(k).upper(): dict(v) for k, v in thresholds.items()},
        extra_rule_dirs=dirs, source=path, project=project,
    )


MAX_THRESHOLD = 1e9  # a threshold beyond this (1e308 workers, ms, bytes...) is a typo, not a setting


def _same_type(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int):  # a count: a whole number
        return isinstance(value, int) and abs(value) <= MAX_THRESHOLD
    if isinstance(default, float):
        return isinstance(value, (int, float)) and math.isfinite(value) and abs(value) <= MAX_THRESHOLD
    return isinstance(value, type(default))


def check_settings(settings: Settings, rules: list[Rule]) -> dict[str, Any]:
    """Check the settings against the rules they apply to (RuleError naming the file otherwise), and
    return what they change, for the report (empty when they change nothing): `file`, `rules_off`
    (ids turned off by select/ignore), `thresholds` ({rule, name, default, value} moved), and
    `project_rules` ({id, file} added by extend-rules)."""
    where = settings.source or "settings"
    by_id = {r.id: r for r in rules}
    moved = []
    for rid, values in sorted(settings.thresholds.items()):
        rule = by_id.get(rid)
        if rule is None:
            raise RuleError(f"{where}: [tool.perfdoctor.thresholds.{rid}]: no rule {rid}")
        for name, value in values.items():
            if name not in rule.thresholds:
                raise RuleError(f"{where}: [tool.perfdoctor.thresholds.{rid}] {name}: {rid} has no such threshold "
                                f"({', '.join(sorted(rule.thresholds)) or 'none'})")
            default = rule.thresholds[name]
            if not _same_type(default, value):
                want = type(default).__name__ if isinstance(default, bool) or not isinstance(default, (int, float)) \
                    else f"a whole number up to {MAX_THRESHOLD:g}" if isinstance(default, int) \
                    else f"a finite number up to {MAX_THRESHOLD:g}"
                raise RuleError(f"{where}: [tool.perfdoctor.thresholds.{rid}] {name} = {value!r}: must be {want}, "
                                f"as its default {default!r}")
            if value != default:
                moved.append({"rule": rid, "name": name, "default": default, "value": value})
    builtin = builtin_rules_dir().resolve()
    added = [{"id": r.id, "file": str(r.path)} for r in rules
             if r.path is not None and not r.path.resolve().is_relative_to(builtin)]
    off = [r.id for r in rules if not settings.enabled(r.id)]
    if not (moved or added or off):
        return {}
    return {"file": str(settings.source) if settings.source else None, "rules_off": off,
            "thresholds": moved, "project_rules": added}


def describe_changes(changes: dict[str, Any]) -> str:
    """One note line saying what the project's config changed (for every format's notes)."""
    parts = []
    if changes.get("rules_off"):
        parts.append("rules turned off: " + ", ".join(changes["rules_off"]))
    if changes.get("thresholds"):
        parts.append("thresholds changed: " + ", ".join(f"{t['rule']}.{t['name']} {t['default']!r} -> {t['value']!r}"
                                                          for t in changes["thresholds"]))
    if changes.get("project_rules"):
        parts.append("project rules added: " + ", ".join(r["id"] for r in changes["project_rules"]))
    return f"the project's config {changes.get('file')} changes what is checked: " + "; ".join(parts)
