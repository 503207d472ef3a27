"""The run history: every `perfdoctor run`, gate run and `report RUN_FOLDER`, kept in one SQLite file.

The store lives beside perfdoctor's own run folders: `.perfdoctor/history.sqlite` under the current
directory for runs in the default `.perfdoctor/runs/`, the `.perfdoctor/history.sqlite` above a run
folder reported from such a place. A run written where the user said (`--out-dir`) is kept only where
the user says (`--history PATH` or `PERFDOCTOR_HISTORY`): perfdoctor writes nothing outside the folders
it was given. `off` turns recording off.

- Schema: versioned by `PRAGMA user_version`, migrated forward one step at a time (`MIGRATIONS`), and
  marked as perfdoctor's by `PRAGMA application_id`. A store written by a newer perfdoctor, or a
  SQLite file that is not a history store, is refused, never migrated or overwritten.
- Concurrency: parallel CI jobs and the ranks of a job may write at once. The store runs in WAL mode
  with a busy timeout, and every write is one `BEGIN IMMEDIATE` transaction, so writers queue instead
  of failing and a reader never sees half a run.
- A damaged or foreign file is one InputError line (exit 2) naming it; it is left as it is.
- The file is someone else's until proven ours: a regular file only (never a FIFO or a device),
  `trusted_schema` off (no function in a view or trigger of a crafted file runs), and each row's
  run record is validated by its typed contract when it is read back.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.contracts.baseline import RunDoc
from perfdoctor.errors import InputError

APPLICATION_ID = 0x70644854  # "pdHT": this SQLite file is a perfdoctor history store
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another's transaction before giving up
DEFAULT_PATH = Path(".perfdoctor") / "history.sqlite"
OFF = ("off", "none", "no", "0", "false")

# Each entry migrates the store from version i to i + 1 (user_version i -> i + 1). Append only: a
# released step is never edited, a change of the schema is a new step.
MIGRATIONS: list[str] = [
    # 0 -> 1: runs and their findings
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,          -- the run's identity: its folder and start time
        recorded_at TEXT NOT NULL,         -- when it was stored (UTC, ISO 8601)
        started TEXT,                      -- when the run itself started
        kind TEXT NOT NULL,                -- run | gate | report
        source TEXT NOT NULL,              -- the run folder
        script TEXT,                       -- the script's path, or the module
        script_name TEXT,                  -- the script's file name or the module: what --script matches
        args TEXT NOT NULL DEFAULT '[]',   -- the script's own arguments (JSON list)
        git_commit TEXT,
        git_branch TEXT,
        git_dirty INTEGER,                 -- 1: the working tree had uncommitted changes
        env_key TEXT NOT NULL,             -- fingerprint of the comparable environment (environment_key)
        env TEXT NOT NULL DEFAULT '{}',    -- the environment itself (JSON)
        steps INTEGER,                     -- steps the run observed
        median_ms REAL,                    -- median of the steady-state steps
        p90_ms REAL,
        gate_ms REAL,                      -- the value the gate judges (a low quantile of the steady steps)
        cpu_wait_ms REAL,                  -- the training thread's wait for a CPU per step (median), where measured
        exit_code INTEGER,
        record TEXT NOT NULL               -- the gate's run record (contracts.baseline.RunDoc, JSON)
    );
    CREATE INDEX runs_by_script ON runs(script_name, started);
    CREATE TABLE findings (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        rule TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        severity TEXT,
        title TEXT,
        file TEXT,
        line INTEGER,
        saving_ms REAL
    );
    CREATE INDEX findings_by_run ON findings(run_id);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass
class HistoryRun:
    """One stored run."""

    key: str
    kind: str
    source: str
    started: str | None
    script: str | None
    script_name: str | None
    args: list[str]
    env_key: str
    env: dict[str, Any]
    record: RunDoc
    recorded_at: str = ""
    git_commit: str | None = None
    git_branch: str | None = None
    git_dirty: bool | None = None
    steps: int | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    gate_ms: float | None = None
    cpu_wait_ms: float | None = None
    exit_code: int | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None


def resolve_path(option: str | Path | None, default: Path | None = DEFAULT_PATH) -> Path | None:
    """The store to use: --history, else PERFDOCTOR_HISTORY, else `default` (None: no history unless
    asked for); None where either says `off`."""
    for value in (option, os.environ.get("PERFDOCTOR_HISTORY")):
        if value is None or str(value) == "":
            continue
        return None if str(value).strip().lower() in OFF else Path(value)
    return default


def _refuse(path: Path, why: str) -> InputError:
    return InputError(f"history store {path}: {why}; perfdoctor leaves it as it is (move it aside, or give "
                      f"another with --history PATH)")


class Store:
    """An open history store. Use as a context manager, or call close()."""

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        self.path = Path(path)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if not create:
                raise InputError(f"history store {self.path}: no such file; `perfdoctor run` records one") from None
            st = None
        except OSError as e:
            raise _refuse(self.path, f"cannot read it ({e.strerror or e})") from None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _refuse(self.path, "not a regular file")
        if st is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise InputError(f"history store {self.path}: cannot create it ({e.strerror or e})") from None
        try:
            self.db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                      check_same_thread=False)
        except sqlite3.Error as e:
            raise _refuse(self.path, f"cannot open it ({e})") from None
        try:
            self.db.execute("PRAGMA trusted_schema = OFF")
            self.db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self.db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
            self.db.execute("PRAGMA journal_mode = WAL")
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise _refuse(self.path, f"damaged or not a SQLite database ({e})") from None

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION, each step in one exclusive transaction (two processes
        opening a new store at once: one creates it, the other then finds it created)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            app = self.db.execute("PRAGMA application_id").fetchone()[0]
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            tables = self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app != APPLICATION_ID and (tables or version):
                raise _refuse(self.path, "a SQLite database, but not a perfdoctor history store")
            if version > SCHEMA_VERSION:
                raise _refuse(self.path, f"written by a newer perfdoctor (schema {version}, this one reads up to "
                                         f"{SCHEMA_VERSION}); upgrade perfdoctor")
            for step in range(version, SCHEMA_VERSION):
                for statement in _statements(MIGRATIONS[step]):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {step + 1}")
            if app != APPLICATION_ID:
                self.db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def add(self, run: HistoryRun) -> int:
        """Store a run (a run already stored under the same key is replaced: `report RUN_FOLDER` of a
        recorded run updates it, never doubles it). Its id."""
        row = {
            "key": run.key, "recorded_at": run.recorded_at, "started": run.started, "kind": run.kind,
            "source": run.source, "script": run.script, "script_name": run.script_name,
            "args": json.dumps(run.args), "git_commit": run.git_commit, "git_branch": run.git_branch,
            "git_dirty": None if run.git_dirty is None else int(run.git_dirty), "env_key": run.env_key,
            "env": json.dumps(run.env, sort_keys=True), "steps": run.steps, "median_ms": run.median_ms,
            "p90_ms": run.p90_ms, "gate_ms": run.gate_ms, "cpu_wait_ms": run.cpu_wait_ms,
            "exit_code": run.exit_code, "record": msgspec.json.encode(run.record).decode(),
        }
        try:
            with self._write() as db:
                old = db.execute("SELECT id, kind FROM runs WHERE key = ?", (run.key,)).fetchone()
                if old is not None:
                    if old[1] in ("run", "gate") and run.kind == "report":
                        row["kind"] = old[1]  # a report of a recorded run keeps how it was run
                    db.execute("DELETE FROM runs WHERE id = ?", (old[0],))
                cols = ", ".join(row)
                cur = db.execute(f"INSERT INTO runs ({cols}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
                run_id = int(cur.lastrowid or 0)
                db.executemany(
                    "INSERT INTO findings (run_id, rule, fingerprint, severity, title, file, line, saving_ms) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(run_id, f.get("rule"), f.get("fingerprint"), f.get("severity"), f.get("title"),
                      f.get("file"), f.get("line"), f.get("saving_ms")) for f in run.findings])
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, f"cannot write to it ({e})") from None
        return run_id

    def runs(self, *, script: str | None = None, branch: str | None = None, env_key: str | None = None,
             kinds: tuple[str, ...] = ("run", "gate", "report"), limit: int | None = None) -> list[HistoryRun]:
        """Stored runs, oldest first (by start time), filtered; `limit`: the newest ones."""
        where, args = [f"kind IN ({', '.join('?' * len(kinds))})"], list(kinds)
        if script is not None:
            where.append("(script_name = ? OR script = ?)")
            args += [script, script]
        if branch is not None:
            where.append("git_branch = ?")
            args.append(branch)
        if env_key is not None:
            where.append("env_key = ?")
            args.append(env_key)
        sql = f"SELECT * FROM runs WHERE {' AND '.join(where)} ORDER BY coalesce(started, recorded_at) DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        try:
            self.db.row_factory = sqlite3.Row
            rows = self.db.execute(sql, args).fetchall()
            found = {r["id"]: [] for r in rows}  # type: dict[int, list[dict[str, Any]]]
            if found:
                marks = ", ".join("?" * len(found))
                for f in self.db.execute(f"SELECT * FROM findings WHERE run_id IN ({marks})", list(found)):
                    found[f["run_id"]].append({k: f[k] for k in f.keys() if k != "run_id"})
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, f"cannot read it ({e})") from None
        finally:
            self.db.row_factory = None
        return [_run_from_row(r, found[r["id"]], self.path) for r in reversed(rows)]

    def scripts(self) -> list[tuple[str, int]]:
        """(script name, runs stored), most runs first."""
        try:
            rows = self.db.execute("SELECT script_name, count(*) FROM runs GROUP BY script_name "
                                   "ORDER BY count(*) DESC, script_name").fetchall()
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, f"cannot read it ({e})") from None
        return [(str(name), int(n)) for name, n in rows if name is not None]

    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])


def _statements(script: str) -> list[str]:
    """A migration's statements, one by one (executescript would commit the open transaction)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _loads(text: Any, default: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else default
    except ValueError:
        return default


def _run_from_row(r: sqlite3.Row, findings: list[dict[str, Any]], path: Path) -> HistoryRun:
    try:
        record = msgspec.json.decode(r["record"], type=RunDoc)
    except (msgspec.DecodeError, TypeError) as e:
        raise _refuse(path, f"run {r['id']} holds a record perfdoctor cannot read ({e})") from None
    args = _loads(r["args"], [])
    env = _loads(r["env"], {})
    return HistoryRun(
        id=r["id"], key=r["key"], kind=r["kind"], source=r["source"], started=r["started"], script=r["script"],
        script_name=r["script_name"], args=[str(a) for a in args] if isinstance(args, list) else [],
        env_key=r["env_key"], env=env if isinstance(env, dict) else {}, record=record, recorded_at=r["recorded_at"],
        git_commit=r["git_commit"], git_branch=r["git_branch"],
        git_dirty=None if r["git_dirty"] is None else bool(r["git_dirty"]), steps=r["steps"],
        median_ms=r["median_ms"], p90_ms=r["p90_ms"], gate_ms=r["gate_ms"], cpu_wait_ms=r["cpu_wait_ms"],
        exit_code=r["exit_code"], findings=findings)
