"""A throwaway PostgreSQL server for tests: initdb in a temp folder, started on a free port.

Uses the Debian/Ubuntu server binaries (/usr/lib/postgresql/<v>/bin) or ones on PATH. As root it
runs the server as the ``postgres`` user (PostgreSQL refuses to run as root). Tests skip with the
reason when no server can be started.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PostgresUnavailable("PostgreSQL server binaries (initdb) are not installed; `apt-get install postgresql`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="flashtune-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise PostgresUnavailable("running as root without runuser; cannot start PostgreSQL as another user")
            subprocess.run(["chown", "-R", "postgres", str(self.root)], check=True)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        result = self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "flashtune", "--no-sync")
        if result.returncode:
            raise PostgresUnavailable(f"initdb failed: {result.stderr.strip()[:300]}")
        self.start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args], capture_output=True, text=True, timeout=120
        )

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://flashtune:secret-pw@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        result = self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")
        if result.returncode:
            log = (self.root / "log").read_text()[-500:] if (self.root / "log").exists() else ""
            raise PostgresUnavailable(f"PostgreSQL did not start: {result.stderr.strip()[:300]} {log}")
        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise PostgresUnavailable("PostgreSQL did not accept connections within 30 s")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
