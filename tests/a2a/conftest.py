"""The A2A tests run in their own virtual environment (a2a-sdk pins protobuf 7), and share
the black-box harness of tests/python (loaded here under another name)."""

import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "python" / "conftest.py"
_spec = importlib.util.spec_from_file_location("blackbox_harness", _path)
blackbox = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(blackbox)

ROOT = blackbox.ROOT
BIN = blackbox.BIN
Server = blackbox.Server
Client = blackbox.Client
RpcError = blackbox.RpcError
run = blackbox.run
spawn_listening = blackbox.spawn_listening
make_certs = blackbox.make_certs
