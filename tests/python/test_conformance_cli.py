"""The conformance runner as a partner runs it: `orchestrator-conformance` (built beside the
server) against the real server binary, with an admin's token and three agents'. Every tier
conforms, and the JSON report says so."""

import json
import pathlib
import subprocess

from conftest import BIN


def test_the_runner_finds_the_server_conforming_in_every_tier(server):
    runner = pathlib.Path(BIN).with_name("orchestrator-conformance")
    assert runner.is_file(), f"{runner} is not built: cargo build --workspace"
    tokens = dict(server.tokens, carol=server.token("carol"))
    out = subprocess.run(
        [str(runner), "--url", server.url, "--admin-token", tokens["admin"], "--json",
         *(f"--token={name}={tokens[name]}" for name in ("alice", "bob", "carol"))],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    for tier in ("core", "scenarios", "push", "http"):
        counts = report["tiers"][tier]
        assert counts["passed"] > 0 and counts["failed"] == 0 and counts["skipped"] == 0, (tier, counts)
    failed = [c for c in report["cases"] if c["outcome"] != "pass"]
    assert failed == []

    # Without carol's token the cases that need her are skipped, and say why; the rest pass.
    out = subprocess.run(
        [str(runner), "--url", server.url, "--admin-token", tokens["admin"], "--tier", "push",
         f"--token=alice={tokens['alice']}", f"--token=bob={tokens['bob']}"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skip push" in out.stdout and "needs a token for carol" in out.stdout
    assert "push      conforms" in out.stdout
