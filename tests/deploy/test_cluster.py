"""`make cluster` for real: scripts/cluster.py starts two `voice-app serve` replicas (real models)
and Debian's nginx on free ports; sessions go through nginx over real websockets.

One cluster serves the whole module and the tests run in file order, each leaving the cluster
as the next expects: sessions spread over both replicas; the load generator counts them per
replica; one replica is SIGKILLed mid-session (its session ends, new ones go to the survivor);
then the survivor is sent SIGTERM and drains (its live reply completes, 1012, exit code 0).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import connect

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600  # two replicas load their models at once on a shared 2-core machine
DRAIN_GRACE_S = 30


def cluster_module():
    """scripts/cluster.py as a module (its nginx lookup and config rendering)."""
    if "cluster_script" not in sys.modules:
        spec = importlib.util.spec_from_file_location("cluster_script", ROOT / "scripts" / "cluster.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["cluster_script"] = module  # before running it: its dataclasses look themselves up
        spec.loader.exec_module(module)
    return sys.modules["cluster_script"]


@dataclass
class Cluster:
    process: subprocess.Popen
    port: int
    replicas: dict[str, dict]  # name -> {"port", "pid", "log"}
    log_path: Path

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    if cluster_module().find_nginx() is None:
        pytest.fail("nginx is not installed, and these tests run the replicas behind a real one: "
                    "apt-get install -y nginx (.ci/run installs it)")
    work = tmp_path_factory.mktemp("cluster")
    state_file, log_path, port = work / "state.json", work / "cluster.log", free_port()
    command = [sys.executable, str(ROOT / "scripts" / "cluster.py"), "--replicas", "2", "--port", str(port),
               "--replica-base-port", "0", "--run-dir", str(work / "run"), "--state-file", str(state_file),
               "--", "--drain-grace-s", str(DRAIN_GRACE_S), "--max-sessions", "4"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not state_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the cluster did not start (exit code {process.poll()}):\n"
                            f"{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        state = json.loads(state_file.read_text())
        yield Cluster(process, port, {r["name"]: r for r in state["replicas"]}, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=DRAIN_GRACE_S + 60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def ask_for_text_reply(ws, text: str, max_tokens: int) -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    await ws.send(json.dumps({"type": "response.create",
                              "response": {"output_modalities": ["text"], "max_output_tokens": max_tokens}}))


async def text_turn(ws, text: str = "Say hello.", max_tokens: int = 8, timeout_s: float = 120) -> dict:
    """Asks for a text reply; returns its response.done."""
    await ask_for_text_reply(ws, text, max_tokens)

    async def done() -> dict:
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "response.done":
                return event
        raise AssertionError(f"closed before response.done: {ws.close_code} {ws.close_reason}")

    return await asyncio.wait_for(done(), timeout_s)


async def start_text_reply(ws, text: str, max_tokens: int) -> None:
    """Asks for a text reply and returns once the server has started it (response.created)."""
    await ask_for_text_reply(ws, text, max_tokens)
    async for message in ws:
        if json.loads(message)["type"] == "response.created":
            return


def replica_of(ws) -> str:
    return ws.response.headers["x-voice-replica"]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by cluster.py) counts as gone
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_the_nginx_config_is_rendered_with_every_replica(tmp_path):
    module = cluster_module()
    replicas = [module.Replica("replica-1", 9001), module.Replica("replica-2", 9002)]
    text = module.render_nginx_config(replicas, "127.0.0.1:9000", tmp_path)
    assert "{{" not in text and "listen 127.0.0.1:9000;" in text
    assert "server 127.0.0.1:9001 max_fails=1" in text and "server 127.0.0.1:9002 max_fails=1" in text
    assert "least_conn;" in text and "proxy_next_upstream_tries 2;" in text
    nginx = module.find_nginx()
    if nginx is None:
        pytest.fail("nginx is not installed: apt-get install -y nginx (.ci/run installs it)")
    (tmp_path / "nginx.conf").write_text(text)
    checked = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr"],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


async def test_sessions_spread_over_both_replicas_and_complete(cluster):
    async with connect(cluster.ws_url) as first, connect(cluster.ws_url) as second:
        # two sessions open at once: least_conn gives the second to the replica without one
        assert {replica_of(first), replica_of(second)} == {"replica-1", "replica-2"}
        dones = await asyncio.gather(text_turn(first), text_turn(second))
    assert [done["response"]["status"] for done in dones] == ["completed", "completed"]


async def test_a_streamed_chat_completion_passes_through_nginx(cluster):
    import httpx

    body = {"model": "smollm2-135m-bd", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]}
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream("POST", f"http://127.0.0.1:{cluster.port}/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200 and reply.headers["x-voice-replica"] in cluster.replicas
            assert reply.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in reply.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3
    assert json.loads(lines[0][6:])["object"] == "chat.completion.chunk"


def test_the_load_generator_counts_sessions_per_replica(cluster, tmp_path):
    script, report = tmp_path / "script.yaml", tmp_path / "report.json"
    script.write_text("turns:\n  - say: What is the capital of France?\n")
    result = subprocess.run([sys.executable, "-m", "voice_app", "loadtest", "--url", cluster.ws_url,
                             "--sessions", "2", "--stagger-ms", "0", "--script", str(script), "--report", str(report)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (level,) = json.loads(report.read_text())["levels"]
    assert level["replicas"] == {name: {"sessions": 1, "turns_completed": 1, "completed": 1}
                                 for name in ("replica-1", "replica-2")}
    assert "per replica: replica-1: 1 sessions (1 turns), replica-2: 1 sessions (1 turns)" in result.stdout


async def test_a_full_replica_refuses_at_the_handshake_and_nginx_passes_the_session_on(cluster):
    """replica-1 is filled behind nginx's back (nginx's least_conn counts only its own
    connections, so it still picks it): its HTTP 503 sends every new session on to replica-2."""
    full = cluster.replicas["replica-1"]
    direct = f"ws://127.0.0.1:{full['port']}/v1/realtime"
    held = [await connect(direct) for _ in range(4)]  # the cluster's --max-sessions
    try:
        for ws in held:
            assert json.loads(await ws.recv())["type"] == "session.created"
        through_nginx = [await connect(cluster.ws_url) for _ in range(3)]
        try:
            assert [replica_of(ws) for ws in through_nginx] == ["replica-2"] * 3
            assert (await text_turn(through_nginx[0]))["response"]["status"] == "completed"
        finally:
            for ws in through_nginx:
                await ws.close()
    finally:
        for ws in held:
            await ws.close()
    # nginx skips a replica for fail_timeout (5 s) after its 503: wait until it is picked again,
    # so the tests after this one have both replicas
    deadline = time.monotonic() + 60
    while True:
        async with connect(cluster.ws_url) as ws:
            if replica_of(ws) == "replica-1":
                break
        assert time.monotonic() < deadline, "nginx never went back to the replica once it had room"
        await asyncio.sleep(0.5)


async def test_a_replica_killed_mid_session_ends_that_session_and_the_survivor_takes_new_ones(cluster):
    async with connect(cluster.ws_url) as ws:
        victim = replica_of(ws)
        survivor = next(name for name in cluster.replicas if name != victim)
        await start_text_reply(ws, "Tell me a long story.", 400)
        os.kill(cluster.replicas[victim]["pid"], signal.SIGKILL)
        killed_at = time.monotonic()

        async def read_until_closed() -> None:
            async for _ in ws:
                pass

        with pytest.raises(websockets.ConnectionClosedError):  # closed abnormally, and without a hang
            await asyncio.wait_for(read_until_closed(), 15)
        assert time.monotonic() - killed_at < 15
        assert ws.close_code != 1000

    for _ in range(3):  # nginx finds the dead replica refusing connections and goes on to the survivor
        async with connect(cluster.ws_url) as ws:
            assert replica_of(ws) == survivor
            assert (await text_turn(ws))["response"]["status"] == "completed"
    assert cluster.process.poll() is None, "the cluster goes on with one replica"
    # the supervisor reports the exit on its next look at the replicas, not at once
    reported = f"{victim} exited with code -9"
    for _ in range(150):
        if reported in cluster.log():
            break
        await asyncio.sleep(0.2)
    assert reported in cluster.log()


async def test_sigterm_drains_a_replica_its_live_reply_completes_then_1012_and_exit_0(cluster):
    (name, replica), = [(n, r) for n, r in cluster.replicas.items() if alive(r["pid"])]
    direct = f"127.0.0.1:{replica['port']}"
    async with connect(cluster.ws_url) as ws:
        assert replica_of(ws) == name
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}}))
        await ws.send(json.dumps({"type": "response.create",
                                  "response": {"output_modalities": ["text"], "max_output_tokens": 48}}))
        events: list[tuple[float, dict]] = []

        async def read() -> None:
            async for message in ws:
                events.append((time.monotonic(), json.loads(message)))

        reader = asyncio.create_task(read())
        while not any(e["type"] == "response.created" for _, e in events):
            await asyncio.sleep(0.01)
        os.kill(replica["pid"], signal.SIGTERM)

        # draining: not ready, new sessions refused with HTTP 503 (nginx would try another replica)
        for _ in range(100):
            status, body = await asyncio.to_thread(get, f"http://{direct}/readyz")
            if status == 503:
                break
            await asyncio.sleep(0.02)
        not_ready_at = time.monotonic()
        assert (status, body["reason"]) == (503, "draining")
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with connect(f"ws://{direct}/v1/realtime"):
                pass
        assert refused.value.response.status_code == 503 and b"draining" in refused.value.response.body
        health_status, health = await asyncio.to_thread(get, f"http://{direct}/healthz")
        assert health_status == 200 and health["draining"] is True  # alive: liveness probes must not kill it

        with pytest.raises(websockets.ConnectionClosed):  # 1012 is not a "normal" close to websockets
            await asyncio.wait_for(reader, DRAIN_GRACE_S + 10)
    done_at, done = next((at, e) for at, e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    assert done_at > not_ready_at, "the reply was still running while the replica drained"
    assert ws.close_code == 1012 and "reconnect" in ws.close_reason
    assert events[-1][1]["type"] in ("response.done", "x_turn.metrics")  # nothing after the reply but the close

    deadline = time.monotonic() + 30
    while f"{name} exited with code" not in cluster.log() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert f"{name} exited with code 0" in cluster.log()


async def test_sigterm_to_make_cluster_drains_every_replica_then_stops_nginx(tmp_path):
    """What Ctrl-C does to `make cluster` (its own cluster of one replica, started for this test)."""
    state_file, log_path, port = tmp_path / "state.json", tmp_path / "cluster.log", free_port()
    command = [sys.executable, str(ROOT / "scripts" / "cluster.py"), "--replicas", "1", "--port", str(port),
               "--replica-base-port", "0", "--state-file", str(state_file), "--", "--drain-grace-s", str(DRAIN_GRACE_S)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not state_file.exists():
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
            await asyncio.sleep(0.5)
        state = json.loads(state_file.read_text())
        run_dir = Path(state["run_dir"])
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await start_text_reply(ws, "Tell me a story.", 32)
            process.send_signal(signal.SIGTERM)
            statuses = []
            with pytest.raises(websockets.ConnectionClosed):
                async for message in ws:
                    event = json.loads(message)
                    if event["type"] == "response.done":
                        statuses.append(event["response"]["status"])
        assert statuses == ["completed"] and ws.close_code == 1012  # through nginx, which stayed up for it
        assert await asyncio.to_thread(process.wait, DRAIN_GRACE_S + 30) == 0, log_path.read_text()[-4000:]
        assert not alive(state["nginx_pid"]) and not alive(state["replicas"][0]["pid"])
        assert "replica-1 stopped (exit code 0)" in log_path.read_text()
        assert not run_dir.exists()  # its temporary directory is removed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
