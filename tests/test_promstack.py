"""tests/promstack.py's servers: each binds a port the kernel picks and reports it.

scripts/test.sh runs the suite on several pytest-xdist workers, so servers of other tests start
at the same moment. A port found free first and handed to Prometheus later (the old
free_port()) can be taken in between by another worker's exporter or client socket, and that
Prometheus then exits with "address already in use". Bound at port 0, nothing can take it.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import yaml

from promstack import alertmanager_config, need, start_listening, stop_all, Webhook


def _answers(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return resp.status


def test_prometheus_and_alertmanager_report_the_port_the_kernel_gave_them(tmp_path: Path) -> None:
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}}))
    webhook = Webhook()
    config = alertmanager_config(tmp_path / "am" / "alertmanager.yml", webhook, ["alertname"])
    procs = []
    try:
        # two Prometheus servers at once, as two workers start them: each has its own port
        ports = []
        for name in ("a", "b"):
            proc, port = start_listening(
                [need("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / name}"], tmp_path / f"{name}.log")
            procs.append(proc)
            ports.append(port)
        am, am_port = start_listening(
            [need("prometheus-alertmanager"), f"--config.file={config}", f"--storage.path={tmp_path / 'am' / 'data'}",
             "--cluster.listen-address="], tmp_path / "alertmanager.log")
        procs.append(am)
        assert len({*ports, am_port}) == 3, (ports, am_port)
        assert all(p > 0 for p in (*ports, am_port)), (ports, am_port)
        # the reported port is the server's own: it answers there
        assert [_answers(p, "/-/healthy") for p in ports] == [200, 200]
        assert _answers(am_port, "/-/healthy") == 200
    finally:
        stop_all(procs)
        webhook.server_close()
