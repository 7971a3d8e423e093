"""RSS of the exporter (TLS on, --gpu.backend=none) before and after N connections that
are silent, or that finish the TLS handshake and one request and then idle kept-alive.

    python benchmarks/connections.py [N]

Prints one line per mode; the exporter under test is the one importable from the repo root.
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from certs import CA  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise KeyError("VmRSS")


def start(cfg: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "resmon_exporter", "--gpu.backend=none", "--web.listen-address=127.0.0.1:0",
         f"--web.config.file={cfg}", "--web.read-header-timeout=60s"],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        match = re.search(r"msg=listening address=\S*?:(\d+)", line)
        if match:
            # keep draining: a full pipe would block the exporter's logging
            threading.Thread(target=lambda: proc.stderr.read() if proc.stderr else None, daemon=True).start()
            return proc, int(match.group(1))
    raise RuntimeError("exporter did not start")


def measure(mode: str, n: int, cfg: Path, ca: CA) -> str:
    proc, port = start(cfg)
    try:
        time.sleep(0.5)
        before = rss_kib(proc.pid)
        ctx = ssl.create_default_context(cafile=str(ca.cert_file))
        held = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if mode == "idle-after-request":
                sock = ctx.wrap_socket(sock, server_hostname="localhost")
                sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.recv(65536)
            held.append(sock)
        time.sleep(1.0)
        after = rss_kib(proc.pid)
        for sock in held:
            sock.close()
        return f"{mode:20} N={n}: RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB (+{(after - before) / 1024:.1f})"
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = CA(d, "server-ca")
        ca.issue("server", "localhost")
        cfg = d / "web.yml"
        cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
        for mode in ("silent", "idle-after-request"):
            print(measure(mode, n, cfg, ca))


if __name__ == "__main__":
    main()
