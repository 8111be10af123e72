"""A private PostgreSQL server for tests: initdb into a temp dir, a free port, stopped at the end.

Use the ``postgres_server`` fixture (import it into a test module) or the
``running_postgres()`` context manager. Tests are skipped, with the reason,
only when no PostgreSQL binaries can be found (Debian's ``postgresql``
package puts them in ``/usr/lib/postgresql/<version>/bin``).

``initdb`` and ``postgres`` refuse to run as root, so under root the server
runs as the ``postgres`` system user (through ``runuser``), in a temp dir
handed to that user.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

_BINARIES = ("initdb", "pg_ctl", "postgres")
_SERVICE_USER = "postgres"


@dataclass(frozen=True)
class PostgresServer:
    """A running private server.

    Attributes:
        host: Always ``127.0.0.1``.
        port: The TCP port it listens on.
        user: The superuser (trust authentication, no password).
        data_dir: Its data directory (removed when it stops).
    """

    host: str
    port: int
    user: str
    data_dir: Path

    @property
    def url(self) -> str:
        """A libpq connection URL for the ``postgres`` database."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/postgres?sslmode=disable"


def find_binaries() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
    found = [shutil.which(name) for name in _BINARIES]
    if all(found):
        folders = {Path(os.path.realpath(path)).parent for path in found if path}
        if len(folders) == 1:
            return folders.pop()

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for folder in candidates:
        if all((folder / name).is_file() for name in _BINARIES):
            return folder
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_service_user() -> list[str]:
    """The command prefix that drops root privileges, or [] when not root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        pytest.skip(
            f"running as root and there is no {_SERVICE_USER!r} user to run PostgreSQL as (initdb refuses root)"
        )
    runuser = shutil.which("runuser") or shutil.which("setpriv")
    if runuser is None:
        pytest.skip("running as root without runuser/setpriv to drop privileges for PostgreSQL")
    if runuser.endswith("setpriv"):
        entry = pwd.getpwnam(_SERVICE_USER)
        return [runuser, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--"]
    return [runuser, "-u", _SERVICE_USER, "--"]


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        msg = f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        raise RuntimeError(msg)


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """Start a private server, yield it, stop it and delete its files.

    Skips the calling test when no PostgreSQL binaries exist.
    """
    binaries = find_binaries()
    if binaries is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl, postgres) found; install Debian's postgresql package")
    prefix = _as_service_user()
    # Under /tmp itself, not pytest's tmp_path: its parents are private to root,
    # and the service user must reach the data directory.
    base = Path(tempfile.mkdtemp(prefix="lc-postgres-"))
    if prefix:
        entry = pwd.getpwnam(_SERVICE_USER)
        os.chown(base, entry.pw_uid, entry.pw_gid)
    data, log = base / "data", base / "server.log"
    started = False
    try:
        _run(
            [
                *prefix,
                str(binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        )
        port = 0
        for _attempt in range(5):
            # Another process may take the port between probing and binding: retry.
            port = _free_port()
            options = f"-h 127.0.0.1 -p {port} -k {base} -F -c fsync=off -c full_page_writes=off"
            try:
                _run(
                    [
                        *prefix,
                        str(binaries / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(log),
                        "-o",
                        options,
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                )
            except RuntimeError:
                time.sleep(0.2)
                continue
            started = True
            break
        if not started:
            text = log.read_text(errors="replace") if log.exists() else "(no log)"
            msg = f"PostgreSQL did not start on a free port; its log:\n{text}"
            raise RuntimeError(msg)
        yield PostgresServer(host="127.0.0.1", port=port, user="postgres", data_dir=data)
    finally:
        if started:
            subprocess.run(
                [*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the tests of one module."""
    with running_postgres() as server:
        yield server
