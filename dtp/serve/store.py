"""The jobs of OpenAI's video API, kept in SQLite (the standard library's sqlite3) under `--state-dir`.

    store = JobStore(state_dir, keep_hours=24, max_attempts=2)
    store.add(id, kind, body, seconds, size, model)   # queued; `body` is the request as JSON (images as base64)
    store.start(id)                                    # in_progress, one attempt more (committed before any rank runs)
    store.complete(id, data) / store.fail(id, message) # the mp4 written under outputs/, then the row
    store.resume()                                     # at start: every job accepted before and not finished

A job accepted is in the database before the client hears its id; a job that was in progress when the server died
is queued again by `resume` up to `max_attempts` attempts, then failed with the reason (`interrupt` keeps it). A
finished job is kept until DELETE or `keep_hours` after it finished. Every write is one committed transaction, so a
SIGKILL of rank 0 loses nothing accepted. Only rank 0 opens the store.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    completed_at INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    seconds TEXT,
    size TEXT,
    model TEXT
)
"""
COLUMNS = (
    "id",
    "kind",
    "body",
    "status",
    "created_at",
    "completed_at",
    "attempts",
    "error",
    "seconds",
    "size",
    "model",
)
FINISHED = ("completed", "failed")


class JobStore:
    def __init__(self, folder, *, keep_hours: float = 24.0, max_attempts: int = 2):
        self.folder = Path(folder)
        self.outputs = self.folder / "outputs"
        self.outputs.mkdir(parents=True, exist_ok=True)
        self.keep_hours = keep_hours
        self.max_attempts = max_attempts
        self._lock = threading.Lock()  # one connection shared by the HTTP thread and the loop's callbacks
        self._db = sqlite3.connect(self.folder / "jobs.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)

    def _write(self, sql: str, *values) -> int:
        with self._lock:
            return self._db.execute(sql, values).rowcount

    def add(self, id: str, kind: str, body: dict, *, seconds: str, size: str, model: str) -> dict:
        now = int(time.time())
        self._write(
            "INSERT INTO jobs (id, kind, body, status, created_at, seconds, size, model) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            *(id, kind, json.dumps(body), "queued", now, seconds, size, model),
        )
        return self.get(id)

    def get(self, id: str) -> dict | None:
        with self._lock:
            row = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE id = ?", (id,)).fetchone()
        return None if row is None else dict(zip(COLUMNS, row, strict=True))

    def list(self) -> list[dict]:
        """Every job, oldest first."""
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs ORDER BY created_at, rowid").fetchall()
        return [dict(zip(COLUMNS, row, strict=True)) for row in rows]

    def start(self, id: str) -> None:
        self._write("UPDATE jobs SET status = 'in_progress', attempts = attempts + 1 WHERE id = ?", id)

    def complete(self, id: str, data: bytes, suffix: str = ".mp4") -> None:
        self.output(id, suffix).write_bytes(data)
        self._write("UPDATE jobs SET status = 'completed', completed_at = ? WHERE id = ?", int(time.time()), id)

    def fail(self, id: str, message: str) -> None:
        self._write(
            "UPDATE jobs SET status = 'failed', error = ?, completed_at = ? WHERE id = ?", message, int(time.time()), id
        )

    def interrupt(self, id: str, message: str) -> None:
        """The job's ranks died under it: keep the reason; `resume` decides (again, or failed)."""
        self._write("UPDATE jobs SET error = ? WHERE id = ?", message, id)

    def cancel(self, id: str) -> bool:
        """Remove a queued job; False when it is no longer queued (it started meanwhile)."""
        return self._write("DELETE FROM jobs WHERE id = ? AND status = 'queued'", id) == 1

    def delete(self, id: str) -> bool:
        """Remove a finished job and its file; False when it is not finished."""
        removed = self._write(f"DELETE FROM jobs WHERE id = ? AND status IN {FINISHED}", id) == 1
        if removed:
            for path in self.outputs.glob(f"{id}.*"):
                path.unlink(missing_ok=True)
        return removed

    def output(self, id: str, suffix: str = ".mp4") -> Path:
        return self.outputs / f"{id}{suffix}"

    def expire(self, now: float | None = None) -> int:
        """Remove the jobs finished more than `keep_hours` ago (and their files); how many."""
        cutoff = (time.time() if now is None else now) - self.keep_hours * 3600
        with self._lock:
            old = [
                r[0]
                for r in self._db.execute(
                    f"SELECT id FROM jobs WHERE status IN {FINISHED} AND completed_at < ?", (cutoff,)
                )
            ]
        return sum(self.delete(id) for id in old)

    def resume(self) -> list[dict]:
        """At start: the jobs to queue again, oldest first. One that was in progress is queued again when it has
        attempts left, else failed with the reason it was interrupted."""
        waiting = []
        for job in self.list():
            if job["status"] == "in_progress" and job["attempts"] >= self.max_attempts:
                reason = job["error"] or "the server stopped during it"
                self.fail(
                    job["id"], f"interrupted {job['attempts']} times (--max-attempts {self.max_attempts}): {reason}"
                )
            elif job["status"] in ("queued", "in_progress"):
                self._write("UPDATE jobs SET status = 'queued' WHERE id = ?", job["id"])
                waiting.append({**job, "status": "queued"})
        return waiting

    def close(self) -> None:
        with self._lock:
            self._db.close()
