"""LlamaServer's own life (settings, start, port, log, stop) without llama.cpp: a stand-in
``llama_cpp.server`` module on the child's ``PYTHONPATH`` that answers ``/v1/models``.

The real server is tested in tests/local_model when the ``local`` extra is installed; these run
everywhere, so a change to how the server object keeps its settings and state is checked here."""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from cuaderno.testing.llama_server import LlamaServer, LlamaServerError

_FAKE_MAIN = """
import argparse, http.server, json
ap = argparse.ArgumentParser()
ap.add_argument("--host")
ap.add_argument("--port", type=int)
ap.add_argument("--model_alias")
args, _ = ap.parse_known_args()

class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": args.model_alias}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer((args.host, args.port), Models).serve_forever()
"""


@pytest.fixture
def fake_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the stand-in ``llama_cpp.server``, put on the child's path; returns a
    (never read) model file's path."""
    server = tmp_path / "llama_cpp" / "server"
    server.mkdir(parents=True)
    (tmp_path / "llama_cpp" / "__init__.py").write_text("")
    (server / "__init__.py").write_text("")
    (server / "__main__.py").write_text(_FAKE_MAIN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path / "model.gguf"


def test_settings_are_kept_converted() -> None:
    server = LlamaServer("m.gguf", n_threads=1, extra_args=["--seed", "7"], port_attempts=0)
    assert server.model == Path("m.gguf")
    assert server.extra_args == ("--seed", "7")
    assert server.python == sys.executable
    assert server.port_attempts == 1
    assert (server.host, server.chat_format, server.n_ctx, server.keep_log) == ("127.0.0.1",
                                                                              "chatml-function-calling", 2048, False)
    assert server.startup_seconds is None and server.log_path is None
    assert LlamaServer().model is None
    assert server != LlamaServer("m.gguf", n_threads=1, extra_args=["--seed", "7"], port_attempts=0)


def test_command_names_every_setting() -> None:
    server = LlamaServer("m.gguf", n_ctx=512, n_threads=3, model_alias="a", extra_args=["--seed", "7"],
                         python="/usr/bin/python3")
    assert server.command(8123) == [
        "/usr/bin/python3", "-m", "llama_cpp.server", "--model", "m.gguf", "--model_alias", "a",
        "--host", "127.0.0.1", "--port", "8123", "--chat_format", "chatml-function-calling", "--n_ctx", "512",
        "--n_threads", "3", "--n_threads_batch", "3", "--seed", "7"]


def test_not_started_says_so() -> None:
    server = LlamaServer("m.gguf")
    assert repr(server) == "<LlamaServer not started>"
    assert not server.running
    for read in (lambda: server.port, lambda: server.pid, server.check_alive):
        with pytest.raises(LlamaServerError, match="not started"):
            read()
    server.stop()  # idempotent, and harmless before a start


def test_start_answer_stop(fake_llama: Path) -> None:
    server = LlamaServer(fake_llama, startup_timeout=30)
    with server:
        assert server.running
        server.check_alive()
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert repr(server) == f"<LlamaServer pid={server.pid} {server.base_url}>"
        assert server.startup_seconds is not None and server.startup_seconds > 0
        with urllib.request.urlopen(f"{server.base_url}/models", timeout=5) as reply:
            assert reply.status == 200
        log = server.log_path
        assert log is not None and log.read_text().startswith("$ ")
        with pytest.raises(LlamaServerError, match="already started"):
            server.start()
    assert not server.running
    assert not log.exists()  # a clean stop drops the log unless keep_log


def test_the_port_asked_for_is_the_port_listened_on(fake_llama: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with LlamaServer(fake_llama, port=port, startup_timeout=30, keep_log=True) as server:
        assert server.port == port
        log = server.log_path
    assert log is not None and log.exists()
    log.unlink()
