"""A local memcached for the embedded default and the tests (Debian: `apt-get install memcached`)."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from infra.process import ManagedProcess, ServiceError, free_port


def find_memcached() -> str | None:
    """Path of the memcached executable, or None when it is not installed."""
    return shutil.which("memcached") or next(
        (p for p in ("/usr/bin/memcached", "/usr/local/bin/memcached") if Path(p).is_file()), None)


class LocalMemcached(ManagedProcess):
    """memcached on a free loopback port, ready once it answers `version`."""

    name = "memcached"

    def __init__(self, log_path: Path, *, port: int | None = None, memory_mb: int = 256,
                 options: Sequence[str] = ()) -> None:
        """`options`: more memcached flags (a test's `-C`)."""
        binary = find_memcached()
        if binary is None:
            raise ServiceError("memcached is not installed (Debian/Ubuntu: apt-get install -y memcached)")
        host = "127.0.0.1"
        port = port or free_port(host)
        argv = [binary, "-l", host, "-p", str(port), "-U", "0", "-m", str(memory_mb), "-t", "2", *options]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv += ["-u", "root"]
        super().__init__(argv, host=host, port=port, log_path=log_path)

    def ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"version\r\n")
                return sock.recv(64).startswith(b"VERSION")
        except OSError:
            return False
