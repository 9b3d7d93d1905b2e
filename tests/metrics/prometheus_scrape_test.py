"""A real Prometheus server scrapes a real zo-server and zo-train while the
worker trains: both targets are up, the series the dashboard uses exist, and
their counters rise between scrapes; promtool accepts both expositions.

Usage: prometheus_scrape_test.py ZO_SERVER ZO_TRAIN DASHBOARD_JSON (exit 77: no
prometheus). Every metric the Grafana dashboard plots must be in a scrape.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SKIP = 77


def metrics_port(log_path, proc, deadline):
    """The port of the 'metrics at http://127.0.0.1:PORT/metrics' log line."""
    while time.time() < deadline:
        with open(log_path, errors="replace") as f:
            m = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", f.read())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"no metrics line in {log_path}:\n" + open(log_path, errors="replace").read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(prom_port, expr):
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return {json.dumps(s["metric"], sort_keys=True): float(s["value"][1])
            for s in body["data"]["result"]}


def wait_for(what, fn, deadline):
    while time.time() < deadline:
        try:
            got = fn()
            if got:
                return got
        except OSError:
            pass  # Prometheus not listening yet
        time.sleep(0.25)
    sys.exit(f"timed out waiting for {what}")


def main():
    server_bin, train_bin, dashboard = sys.argv[1], sys.argv[2], sys.argv[3]
    prometheus = shutil.which("prometheus")
    promtool = shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("SKIP: no prometheus/promtool on PATH (Debian package prometheus)")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="zo_prom_")
    procs = []
    try:
        deadline = time.time() + 120
        server_log = os.path.join(tmp, "server.log")
        server = subprocess.Popen([server_bin, "--listen", "127.0.0.1:0", "--metrics-listen",
                                   "127.0.0.1:0", "--port-file", os.path.join(tmp, "port")],
                                  stdout=open(server_log, "w"), stderr=subprocess.STDOUT)
        procs.append(server)
        server_metrics = metrics_port(server_log, server, deadline)
        port_file = os.path.join(tmp, "port")
        wait_for("the server's port file", lambda: os.path.exists(port_file), deadline)
        grpc_port = open(port_file).read().strip()

        train_log = os.path.join(tmp, "train.log")
        train = subprocess.Popen([train_bin, "--model", "mlp", "--mlp-width", "64", "--mlp-depth",
                                  "2", "--steps", "1000000", "--servers", f"127.0.0.1:{grpc_port}",
                                  "--job", "prom", "--metrics-listen", "127.0.0.1:0"],
                                 stdout=open(train_log, "w"), stderr=subprocess.STDOUT)
        procs.append(train)
        train_metrics = metrics_port(train_log, train, deadline)

        # Wait for a few steps, so every family has its samples.
        wait_for("a few steps", lambda: re.search(
            r'^zo_train_steps_total\{[^}]*\} ([1-9]\d+)', urllib.request.urlopen(
                f"http://127.0.0.1:{train_metrics}/metrics", timeout=5).read().decode(), re.M),
            deadline)
        # promtool lints what each endpoint serves (names, types, help).
        exposed = set()
        for port in (server_metrics, train_metrics):
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            exposed |= set(re.findall(r"^(zo_\w+)", text.decode(), re.M))
            lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
            if lint.returncode != 0:
                sys.exit(f"promtool check metrics on :{port}:\n{lint.stdout.decode()}"
                         f"{lint.stderr.decode()}")

        # The dashboard plots only what the endpoints serve.
        with open(dashboard) as f:
            exprs = [t["expr"] for panel in json.load(f)["panels"] for t in panel.get("targets", [])]
        plotted = {n for e in exprs for n in re.findall(r"\b(zo_(?:server|train)_\w+)", e)}
        missing = sorted(plotted - exposed)
        if not exprs or missing:
            sys.exit(f"dashboard {dashboard}: {len(exprs)} queries; not served: {missing}")
        print(f"dashboard: {len(exprs)} queries over {len(plotted)} metrics, all served")

        prom_port = free_port()
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: zo-server
    static_configs: [{{targets: ["127.0.0.1:{server_metrics}"]}}]
  - job_name: zo-train
    static_configs: [{{targets: ["127.0.0.1:{train_metrics}"]}}]
""")
        prom = subprocess.Popen([prometheus, f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=open(os.path.join(tmp, "prometheus.log"), "w"),
                                stderr=subprocess.STDOUT)
        procs.append(prom)

        up = wait_for("both targets up",
                      lambda: (lambda r: r if len(r) == 2 and all(v == 1 for v in r.values())
                               else None)(query(prom_port, "up")), deadline)
        print("up:", up)
        # zo_job: the job on the servers (Prometheus keeps "job" for the scrape job).
        series = {
            "server steps": 'zo_server_job_steps_total{zo_job="prom"}',
            "server gradient bytes": 'zo_server_job_bytes_total{zo_job="prom",direction="in"}',
            "server update seconds": 'zo_server_job_step_seconds_total{zo_job="prom",phase="update"}',
            "PushGradients OK": 'zo_server_rpcs_total{method="PushGradients",code="OK"}',
            "worker steps": 'zo_train_steps_total{zo_job="prom"}',
            "worker pushed bytes": 'zo_train_bytes_total{zo_job="prom",direction="out"}',
        }
        # Two samples a few scrapes apart: increase() > 0 means the counter
        # moved while Prometheus watched.
        for name, expr in series.items():
            got = wait_for(f"{name} to rise", lambda: {k: v for k, v in query(
                prom_port, f"increase({expr}[10s])").items() if v > 0}, deadline)
            print(f"{name}: increase over 10 s {list(got.values())[0]:.4g}")
        loss = wait_for("the worker's loss", lambda: query(prom_port, 'zo_train_loss'), deadline)
        print("loss:", list(loss.values())[0])
        print("PASS")
        return 0
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
