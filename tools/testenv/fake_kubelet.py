"""A stand-in kubelet for the test kube-apiserver: it registers its Node, serves logs and exec.

Why: there is no container runtime here, but ``pods/log`` and ``pods/exec`` must go through the real
apiserver, which proxies to the kubelet of the pod's node. Exec runs the command as a local process.
Logs are deterministic (``<ns>/<pod>/<ctr> line <i>``); ``follow`` adds a line every 0.2 s until the
client goes away. ``GET /debug/streams`` reports the open log streams and exec sessions, so tests can
prove abandoned ones are released.

Usage: python fake_kubelet.py KUBECONFIG CERT KEY PORT NODE
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from typing import Any

from aiohttp import WSMsgType, web
from kubernetes import client, config

LINES = 10
OPEN = web.AppKey("open", dict)
RESIZES = web.AppKey("resizes", dict)


def register_node(kubeconfig: str, node: str, port: int) -> None:
    """Create the Node and report where its kubelet listens, like a kubelet does at start."""
    core = client.CoreV1Api(config.new_client_from_config(kubeconfig))
    try:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    core.patch_node_status(node, {"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake"}],
    }})


async def container_logs(request: web.Request) -> web.StreamResponse:
    ns, pod, ctr = request.match_info["ns"], request.match_info["pod"], request.match_info["ctr"]
    try:
        tail = int(request.query.get("tailLines", LINES))
    except ValueError:
        tail = LINES
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    for i in range(max(0, LINES - tail), LINES):
        await resp.write(f"{ns}/{pod}/{ctr} line {i}\n".encode())
    if request.query.get("follow") == "true":
        key = f"{ns}/{pod}/{ctr}"
        opened = request.app[OPEN]
        opened[key] = opened.get(key, 0) + 1
        try:
            i = LINES
            while True:
                await asyncio.sleep(0.2)
                await resp.write(f"{ns}/{pod}/{ctr} line {i}\n".encode())
                i += 1
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            opened[key] -= 1
        return resp
    await resp.write_eof()
    return resp


async def exec_(request: web.Request) -> web.WebSocketResponse:
    """Run the command as a local process: channel 0 stdin, 1 stdout, 2 stderr, 3 the final Status.

    When the client hangs up, stdin is closed and the process killed if it lingers, so no session leaks.
    The session is counted from the upgrade to the very end, cancellation included: a hang-up while the
    process was still being started cancelled the handler there (seen in a trace), and a count that missed
    that case left a phantom session which a later test, in the next catalog's run, read as a leak.
    """
    cmd = request.query.getall("command", [])
    ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io", "channel.k8s.io"))
    await ws.prepare(request)
    opened = request.app[OPEN]
    opened["exec"] = opened.get("exec", 0) + 1
    try:
        await _run_exec(ws, cmd, request.app[RESIZES], request.match_info["pod"])
    finally:
        opened["exec"] -= 1
    return ws


async def _run_exec(ws: web.WebSocketResponse, cmd: list[str], resizes: dict[str, Any], pod: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin = proc.stdin

    async def pump(stream: asyncio.StreamReader, channel: int) -> None:
        while data := await stream.read(4096):
            if not ws.closed:
                await ws.send_bytes(bytes([channel]) + data)

    async def feed() -> None:
        async for msg in ws:
            data = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode()
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            if data[:1] == b"\x00":
                stdin.write(data[1:])
                await stdin.drain()
            elif data[:1] == b"\x04":  # terminal size: remembered per pod for /debug/resizes
                resizes[pod] = json.loads(data[1:])
        if proc.returncode is None:  # client hung up: close stdin, then kill
            stdin.close()
            await asyncio.sleep(0.5)
            if proc.returncode is None:
                proc.kill()

    feeder = asyncio.create_task(feed())
    try:
        await asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
        rc = await proc.wait()
        if not ws.closed:
            status = {"metadata": {}, "status": "Success"} if rc == 0 else {
                "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]}}
            await ws.send_bytes(b"\x03" + json.dumps(status).encode())
            await ws.close()
    finally:
        feeder.cancel()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def streams(request: web.Request) -> web.Response:
    return web.json_response({k: v for k, v in request.app[OPEN].items() if v})


async def resizes(request: web.Request) -> web.Response:
    return web.json_response(request.app[RESIZES])


def main() -> None:
    kubeconfig, cert, key, port, node, client_ca = sys.argv[1:7]
    register_node(kubeconfig, node, int(port))
    app = web.Application(handler_args={"handler_cancellation": True})
    app[OPEN] = {}
    app[RESIZES] = {}
    app.router.add_get("/containerLogs/{ns}/{pod}/{ctr}", container_logs)
    app.router.add_get("/debug/streams", streams)
    app.router.add_get("/debug/resizes", resizes)
    app.router.add_route("*", "/exec/{ns}/{pod}/{ctr}", exec_)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    # Like a real kubelet (--client-ca-file): only clients with a certificate the cluster CA signed, i.e. the
    # apiserver, may read logs or run commands; nothing else on the host may reach the pods through it.
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(client_ca)
    web.run_app(app, host="127.0.0.1", port=int(port), ssl_context=ctx, print=None)


if __name__ == "__main__":
    main()
