"""`make cluster REPLICAS=N PORT=P`: N `voice-app serve` replicas behind Debian's nginx, in the
foreground (docs/deploy.md).

Each replica listens on 127.0.0.1 on its own port (P+1 ... P+N by default; 0: free ports) with
its own models; once every replica answers /readyz, nginx is started on P with
deploy/nginx/voice-app.conf.template rendered into a temporary directory (no root needed).
Ctrl-C or SIGTERM drains the replicas (each finishes its live replies, then closes its sessions
with 1012 and exits 0), then stops nginx. A replica that dies is reported and the others go on
serving (nginx routes around it); when none is left, the cluster stops.

    .venv/bin/python scripts/cluster.py --replicas 2 --port 8080 [-- --max-sessions 4 ...]

`--state-file` writes the ports and process ids as JSON once everything is up (tests use it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "deploy" / "nginx" / "voice-app.conf.template"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


@dataclass
class Replica:
    name: str
    port: int
    pid: int = 0
    log: str = ""


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


def find_nginx() -> str | None:
    return shutil.which("nginx") or next((path for path in NGINX_CANDIDATES if os.access(path, os.X_OK)), None)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def render_nginx_config(replicas: list[Replica], listen: str, run_dir: Path, max_fails: int = 1,
                        fail_timeout_s: int = 5, template: Path = TEMPLATE) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{r.port} max_fails={max_fails} fail_timeout={fail_timeout_s}s;"
                        for r in replicas)
    text = template.read_text()
    for key, value in {"SERVERS": servers, "LISTEN": listen, "RUN_DIR": str(run_dir),
                       "REPLICAS": str(len(replicas))}.items():
        text = text.replace("{{" + key + "}}", value)
    if "{{" in text:
        raise ValueError(f"{template} has a placeholder left: {text[text.index('{{'):][:40]}")
    return text


def voice_app_command() -> list[str]:
    script = Path(sys.executable).with_name("voice-app")
    return [str(script)] if script.exists() else [sys.executable, "-m", "voice_app"]


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


class Cluster:
    def __init__(self, args: argparse.Namespace, serve_args: list[str]):
        self.args = args
        self.serve_args = serve_args
        self.run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="voice-cluster-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}
        self.nginx: subprocess.Popen | None = None
        self.stopping = False
        base = args.replica_base_port if args.replica_base_port is not None else args.port + 1
        self.replicas = [Replica(f"replica-{i + 1}", free_port("127.0.0.1") if base == 0 else base + i)
                         for i in range(args.replicas)]

    def start_replicas(self) -> None:
        for replica in self.replicas:
            replica.log = str(self.run_dir / f"{replica.name}.log")
            command = [*voice_app_command(), "serve", "--host", "127.0.0.1", "--port", str(replica.port),
                       "--replica-name", replica.name, *self.serve_args]
            with open(replica.log, "wb") as out:
                # own session: a terminal's Ctrl-C reaches only this script, which drains them once
                process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            replica.pid = process.pid
            self.processes[replica.name] = process
            log(f"{replica.name}: pid {process.pid}, port {replica.port}, log {replica.log}")

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = {r.name: r for r in self.replicas}
        while waiting:
            for name, replica in list(waiting.items()):
                code = self.processes[name].poll()
                if code is not None:
                    tail = Path(replica.log).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with code {code} while starting:\n{tail}")
                if ready(replica.port):
                    log(f"{name} ready on port {replica.port}")
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"not ready after {timeout_s:.0f} s: {', '.join(waiting)}")
            if self.stopping:
                raise KeyboardInterrupt
            time.sleep(0.5)

    def start_nginx(self, nginx: str) -> None:
        listen = f"{self.args.host}:{self.args.port}"
        config = self.run_dir / "nginx.conf"
        config.write_text(render_nginx_config(self.replicas, listen, self.run_dir))
        command = [nginx, "-p", str(self.run_dir), "-c", str(config), "-e", "stderr", "-g", "daemon off;"]
        test = subprocess.run([*command, "-t"], capture_output=True, text=True)
        if test.returncode != 0:
            raise RuntimeError(f"nginx rejected {config}:\n{test.stderr}")
        self.nginx = subprocess.Popen(command, start_new_session=True)  # Ctrl-C would stop it fast
        deadline = time.monotonic() + 10
        while not self._port_open(self.args.port):
            if self.nginx.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start listening on {listen}")
            time.sleep(0.1)
        log(f"nginx (pid {self.nginx.pid}) on http://{listen} -> {len(self.replicas)} replicas; config {config}")

    def _port_open(self, port: int) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((self.args.host if self.args.host != "0.0.0.0" else "127.0.0.1", port)) == 0

    def write_state(self) -> None:
        if self.args.state_file:
            state = {"port": self.args.port, "run_dir": str(self.run_dir),
                     "nginx_pid": self.nginx.pid if self.nginx else None,
                     "replicas": [asdict(r) for r in self.replicas]}
            temporary = Path(str(self.args.state_file) + ".tmp")
            temporary.write_text(json.dumps(state, indent=2))
            temporary.replace(self.args.state_file)

    def supervise(self) -> int:
        """Until a signal, nginx dies or no replica is left; returns the exit code."""
        reported: set[str] = set()
        while not self.stopping:
            for name, process in self.processes.items():
                if process.poll() is not None and name not in reported:
                    reported.add(name)
                    log(f"{name} exited with code {process.returncode}; nginx routes around it")
            if len(reported) == len(self.processes):
                log("no replica left; stopping")
                return 1
            if self.nginx is not None and self.nginx.poll() is not None:
                log(f"nginx exited with code {self.nginx.returncode}; stopping")
                return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> int:
        """Drains the replicas (SIGTERM), then stops nginx; 0 when every replica drained cleanly."""
        live = {name: p for name, p in self.processes.items() if p.poll() is None}
        for process in live.values():
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.args.stop_timeout
        code = 0
        for name, process in live.items():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{name} did not stop in time; killing it")
                process.kill()
                process.wait()
            if process.returncode != 0:
                code = 1
            log(f"{name} stopped (exit code {process.returncode})")
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.send_signal(signal.SIGQUIT)  # graceful: finish what is in flight
            try:
                self.nginx.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.nginx.kill()
                self.nginx.wait()
        if not self.args.run_dir and not self.args.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return code


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Arguments after -- go to every `voice-app serve`.")
    parser.add_argument("--replicas", type=int, default=2, help="how many voice-app serve processes (default 2)")
    parser.add_argument("--port", type=int, default=8765, help="nginx's port (default 8765)")
    parser.add_argument("--host", default="127.0.0.1", help="nginx's address (default 127.0.0.1)")
    parser.add_argument("--replica-base-port", type=int,
                        help="the first replica's port; the others follow (default PORT+1; 0: free ports)")
    parser.add_argument("--ready-timeout", type=float, default=600, help="seconds for every replica to load")
    parser.add_argument("--stop-timeout", type=float, default=60,
                        help="seconds the replicas get to drain on Ctrl-C / SIGTERM before they are killed")
    parser.add_argument("--run-dir", help="where the nginx config, its logs and the replicas' logs go "
                                          "(default: a temporary directory, removed on exit)")
    parser.add_argument("--keep-run-dir", action="store_true", help="keep the temporary directory")
    parser.add_argument("--state-file", type=Path, help="write ports and process ids here as JSON once up")
    argv = sys.argv[1:] if argv is None else argv
    serve_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, serve_args = argv[:split], argv[split + 1:]
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas must be >= 1")
    return args, serve_args


def main(argv: list[str] | None = None) -> int:
    args, serve_args = parse_args(argv)
    nginx = find_nginx()
    if nginx is None:
        log("nginx is not installed; on Debian/Ubuntu: apt-get install -y nginx")
        return 2
    cluster = Cluster(args, serve_args)

    def on_signal(signum: int, frame: object) -> None:
        cluster.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 1
    try:
        cluster.start_replicas()
        cluster.wait_ready(args.ready_timeout)
        cluster.start_nginx(nginx)
        cluster.write_state()
        log(f"serving on http://{args.host}:{args.port} (Ctrl-C drains and stops)")
        code = cluster.supervise()
    except KeyboardInterrupt:
        code = 0
    except (RuntimeError, ValueError, OSError) as exc:
        log(str(exc))
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the drain short
        stopped = cluster.stop()
    return code or stopped


if __name__ == "__main__":
    sys.exit(main())
