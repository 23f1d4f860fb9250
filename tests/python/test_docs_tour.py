"""The README's tour and docs/external-agent.md's "Try it" run as written, on a fresh database:
every shell block marked `<!-- tour -->` in a document, in order, in one bash with `set -eu`,
in an empty directory beside the checkout's `examples` and `sdks`. Only what a test must change
is changed: the port (a free one for 7300), and `cargo build`, which the suite has already done
(a `cargo` on the PATH that builds nothing), with the built binaries on the PATH. A tour that
fails, or whose output lacks what the document says it shows, fails here."""

import os
import pathlib
import re
import signal
import socket
import subprocess

from conftest import BIN, ROOT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tour_of(document):
    """The shell blocks marked as the tour, in order."""
    text = (ROOT / document).read_text()
    return re.findall(r"<!-- tour -->\n```sh\n(.*?)```", text, re.S)


def run_tour(document, tmp_path):
    blocks = tour_of(document)
    assert blocks, f"{document} marks no tour"
    port = free_port()
    work = tmp_path / "checkout"
    work.mkdir()
    for shared in ["examples", "sdks"]:
        (work / shared).symlink_to(ROOT / shared)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "cargo").write_text("#!/bin/sh\n# the suite built everything already\nexit 0\n")
    (shim / "cargo").chmod(0o755)
    # `export PATH="$PWD/target/release:$PATH"` finds the built binaries there.
    (work / "target").mkdir()
    (work / "target" / "release").symlink_to(pathlib.Path(BIN).parent)
    script = "set -eu\n" + "\n".join(blocks).replace("7300", str(port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env["PATH"] = f"{shim}:{pathlib.Path(BIN).parent}:{env['PATH']}"
    # `serve`'s default address, moved to the same free port.
    env["ORCHESTRATOR_LISTEN"] = f"127.0.0.1:{port}"
    log = tmp_path / "tour.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=120)
        finally:
            # What the tour left running (the server, the partner agent) stops with it.
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    said = log.read_text()
    assert proc.returncode == 0, f"the tour of {document} failed:\n{said}"
    return said


def test_the_readme_tour_runs_as_written(tmp_path):
    out = run_tour("README.md", tmp_path)
    for shown in ["stopped: on_text", '{"conversationId":"c1"}', '"duplicate":false', '"text":"hello"',
                  '"guidance"', "You said: hello", "SPEAKER", "connected"]:
        assert shown in out, f"{shown!r} not in the tour's output:\n{out}"


def test_the_external_agent_guide_runs_as_written(tmp_path):
    out = run_tour("docs/external-agent.md", tmp_path)
    assert "You said: hello" in out, out
