"""`rsub status|subscriptions|snapshots|trigger-snapshot|set-replicated` against a real gRPC server (in-memory backend).

The CLI uses the blocking gRPC client, so it runs in a worker thread while the grpc.aio
server keeps serving on the test's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sidecar
from rsub_dev.ports import free_ports
from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.cli import main
from sidecar.cli.remote import table
from sidecar.config.schema import GrpcTlsConfig
from sidecar.protocol import SubscriptionKind
from tests.support.api_fakes import STREAM, SUBSCRIPTION, Certs, MemoryBackend


async def rsub(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def column_of(text: str, line_start: str, cell: str) -> int:
    line = next(x for x in text.splitlines() if x.startswith(line_start))
    return line.index(cell)


async def test_status_table(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await rsub(capsys, "status", "--sidecar", f"127.0.0.1:{grpc_server.port}")
    assert (code, err) == (0, "")
    assert "replica  west-a" in out and "leads    1 of 1 streams" in out
    assert "regions  east, north, west" in out
    # Columns line up: each header starts where its values start.
    assert column_of(out, "STREAM  LEADER", "EPOCH") == column_of(out, "orders  west-a", "5")
    assert column_of(out, "STREAM  LEADER", "READ STREAM") == column_of(
        out, "orders  west-a (this replica)", "orders-read-west"
    )
    assert column_of(out, "STREAM  SOURCE", "LAST MARKER") == column_of(
        out, "orders  north", "never"
    )
    assert "1.5s ago" in out


async def test_status_json_has_stable_keys(
    grpc_server: GrpcServerHandle,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RSUB_SIDECAR", f"127.0.0.1:{grpc_server.port}")
    code, out, _ = await rsub(capsys, "status", "--json")
    assert code == 0
    data = json.loads(out)
    assert sorted(data) == [
        "connected",
        "epoch",
        "holder",
        "leader",
        "region",
        "regions",
        "streams",
        "version",
    ]
    stream = data["streams"][0]
    assert stream["last_snapshot_age_ms"] == 1500
    assert stream["sources"][1] == {
        "origin_region": "north",
        "active": False,
        "last_marker_age_ms": None,
        "lag_messages": 0,
    }


async def test_subscriptions_table_and_json(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, _ = await rsub(capsys, "subscriptions", STREAM, "--sidecar", target)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "SUBSCRIPTION",
        "KIND",
        "REPLICATED",
        "MARK-DELETE",
        "LAST",
        "SNAPSHOT",
        "AT",
        "UPDATE",
        "SENT",
        "CACHED",
        "EXPOSURE",
        "APPLIED",
        "FROM",
    ]
    assert lines[1].split()[:5] == ["audit", "durable", "yes", "3", "-"]
    assert lines[1].split()[-2:] == ["-", "-"]  # no progress received: no exposure
    assert lines[2].split() == [
        "billing",
        "durable",
        "yes",
        "41",
        "snap-7",
        "40",
        "2023-11-14T22:13:20.500Z",
        "2",
        "3",
        "east@17",
    ]

    code, out, _ = await rsub(capsys, "subscriptions", STREAM, "--sidecar", target, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["stream"] == STREAM
    billing = data["subscriptions"][1]
    assert billing["kind"] == "durable"
    assert billing["mark_delete"] == 41
    assert billing["applied"] == [
        {
            "from_region": "east",
            "snapshot_id": "snap-3",
            "position": 17,
            "applied_unix_ms": 1_700_000_000_900,
        }
    ]
    assert data["subscriptions"][0]["last_update_sent_unix_ms"] is None
    assert billing["progress"] == {"east": 9}
    assert billing["failover_exposure"] == 3
    assert billing["progress_sent"] == {"east": 7, "west": 30}
    assert billing["progress_sent_position"] == 41
    assert data["subscriptions"][0]["failover_exposure"] is None


async def test_snapshots_table_and_json(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, _ = await rsub(capsys, "snapshots", STREAM, "--sidecar", target)
    assert code == 0
    assert out.splitlines()[1].split() == [
        "snap-7",
        "40",
        "east=33",
        "north=12",
        "2023-11-14T22:13:20.400Z",
        "12ms",
    ]
    code, out, _ = await rsub(capsys, "snapshots", STREAM, "--sidecar", target, "--json")
    assert json.loads(out)["snapshots"][0]["positions"] == {"east": 33, "north": 12}

    backend.snapshots[STREAM] = []
    code, out, _ = await rsub(capsys, "snapshots", STREAM, "--sidecar", target)
    assert (code, out.strip()) == (0, "no snapshots kept for stream 'orders'")


async def test_errors_show_status_and_detail(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, err = await rsub(capsys, "subscriptions", "payments", "--sidecar", target)
    assert (code, out) == (1, "")
    assert err.startswith("error: NOT_FOUND: ") and "payments" in err
    code, _, err = await rsub(capsys, "snapshots", "bad.name", "--sidecar", target)
    assert code == 1
    assert err.startswith("error: INVALID_ARGUMENT: stream: ")
    # A sidecar that answers UNAVAILABLE is reachable: exit 1, not 2.
    backend.unavailable = True
    code, _, err = await rsub(capsys, "status", "--sidecar", target)
    assert (code, err.strip()) == (1, "error: UNAVAILABLE: NATS connection lost")


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["trigger-snapshot", STREAM],
        ["set-replicated", STREAM, SUBSCRIPTION, "off"],
    ],
)
async def test_unreachable_sidecar_exits_2(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    target = f"127.0.0.1:{free_ports(1)[0]}"
    code, out, err = await rsub(capsys, *command, "--sidecar", target)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: cannot reach the sidecar at {target}")


async def test_bad_tls_options_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, certs: Certs
) -> None:
    code, _, err = await rsub(capsys, "status", "--tls-cert", str(certs.client_cert))
    assert (code, err.strip()) == (2, "error: --tls-cert and --tls-key go together")
    code, _, err = await rsub(capsys, "status", "--tls-ca", str(tmp_path / "missing.pem"))
    assert code == 2
    assert err.startswith("error: --tls-ca: cannot read ")


@pytest.fixture
async def guarded_server(backend: MemoryBackend, certs: Certs) -> AsyncIterator[GrpcServerHandle]:
    tls = GrpcTlsConfig(certs.server_cert, certs.server_key, client_ca_file=certs.ca)
    server = await start_grpc_server(backend, "127.0.0.1:0", auth_token="t0ken", tls=tls)
    yield server
    await server.stop(None)


async def test_token_and_mutual_tls(
    guarded_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], certs: Certs
) -> None:
    target = ["--sidecar", f"localhost:{guarded_server.port}", "--tls-ca", str(certs.ca)]
    client = ["--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)]
    code, _, err = await rsub(capsys, "status", *target, *client, "--token", "t0ken")
    assert (code, err) == (0, "")
    code, _, err = await rsub(capsys, "status", *target, *client)
    assert code == 1
    assert err.startswith("error: UNAUTHENTICATED: ")
    code, _, err = await rsub(capsys, "status", *target, *client, "--token", "nope")
    assert code == 1
    assert err.startswith("error: PERMISSION_DENIED: ")
    # Reads stay open without a token; without a client certificate the handshake fails.
    code, _, _ = await rsub(capsys, "subscriptions", STREAM, *target, *client)
    assert code == 0
    code, _, err = await rsub(capsys, "subscriptions", STREAM, *target)
    assert code == 2
    assert "cannot reach the sidecar" in err


async def test_admin_commands_need_the_token(
    guarded_server: GrpcServerHandle,
    capsys: pytest.CaptureFixture[str],
    certs: Certs,
    backend: MemoryBackend,
) -> None:
    target = ["--sidecar", f"localhost:{guarded_server.port}", "--tls-ca", str(certs.ca)]
    target += ["--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)]
    for command in (["trigger-snapshot", STREAM], ["set-replicated", STREAM, SUBSCRIPTION, "off"]):
        code, out, err = await rsub(capsys, *command, *target)
        assert (code, out) == (1, "")
        assert err.startswith("error: UNAUTHENTICATED: ")
    assert backend.snapshot_counter == 0
    assert backend.subscriptions[STREAM][SUBSCRIPTION].replicated
    code, out, err = await rsub(capsys, "trigger-snapshot", STREAM, *target, "--token", "t0ken")
    assert (code, out, err) == (0, "snap-manual-1\n", "")
    code, _, err = await rsub(
        capsys, "set-replicated", STREAM, SUBSCRIPTION, "off", *target, "--token", "t0ken"
    )
    assert (code, err) == (0, "")
    assert not backend.subscriptions[STREAM][SUBSCRIPTION].replicated


async def test_trigger_snapshot_prints_id_and_json(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, err = await rsub(capsys, "trigger-snapshot", STREAM, "--sidecar", target)
    assert (code, out, err) == (0, "snap-manual-1\n", "")
    code, out, _ = await rsub(capsys, "trigger-snapshot", STREAM, "--sidecar", target, "--json")
    assert code == 0
    assert json.loads(out) == {"stream": STREAM, "snapshot_id": "snap-manual-2"}


async def test_trigger_snapshot_without_replicated_subscription(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    for name in list(backend.subscriptions[STREAM]):
        code, _, _ = await rsub(capsys, "set-replicated", STREAM, name, "off", "--sidecar", target)
        assert code == 0
    code, out, err = await rsub(capsys, "trigger-snapshot", STREAM, "--sidecar", target)
    assert (code, out) == (1, "")
    assert err.startswith("error: FAILED_PRECONDITION: ") and "no replicated subscription" in err


async def test_set_replicated_prints_the_subscription_row(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, err = await rsub(
        capsys, "set-replicated", STREAM, SUBSCRIPTION, "off", "--sidecar", target
    )
    assert (code, err) == (0, "")
    assert not backend.subscriptions[STREAM][SUBSCRIPTION].replicated
    _, listed, _ = await rsub(capsys, "subscriptions", STREAM, "--sidecar", target)
    header, row = out.splitlines()
    # The same header and the same row as in the `subscriptions` table.
    assert header.split() == listed.splitlines()[0].split()
    assert row.split() == listed.splitlines()[2].split()
    assert row.split()[:4] == [SUBSCRIPTION, "durable", "no", "41"]

    code, out, _ = await rsub(
        capsys, "set-replicated", STREAM, SUBSCRIPTION, "ON", "--sidecar", target, "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert (data["subscription"], data["replicated"], data["mark_delete"]) == (
        SUBSCRIPTION,
        True,
        41,
    )
    assert data["applied"][0]["from_region"] == "east"
    assert backend.subscriptions[STREAM][SUBSCRIPTION].replicated


async def test_set_replicated_accepts_true_false_in_any_case(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    for word, expected in (("False", False), ("TRUE", True), ("oFF", False), ("on", True)):
        code, _, _ = await rsub(
            capsys, "set-replicated", STREAM, "audit", word, "--sidecar", target
        )
        assert code == 0
        assert backend.subscriptions[STREAM]["audit"].replicated is expected


async def test_set_replicated_rejects_other_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        await rsub(capsys, "set-replicated", STREAM, SUBSCRIPTION, "maybe")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument replicated: expected on, off, true or false, not 'maybe'" in err


async def test_admin_commands_on_a_follower(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    backend.is_leader = False
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, err = await rsub(capsys, "trigger-snapshot", STREAM, "--sidecar", target)
    assert (code, out) == (1, "")
    assert err.startswith("error: FAILED_PRECONDITION: ") and "follower" in err
    assert backend.snapshot_counter == 0
    code, _, _ = await rsub(
        capsys, "set-replicated", STREAM, SUBSCRIPTION, "off", "--sidecar", target
    )
    assert code == 0 and not backend.subscriptions[STREAM][SUBSCRIPTION].replicated


def test_table_aligns_and_trims() -> None:
    assert table(("A", "LONG HEADER", "C"), [("xyz", "1", ""), ("", "22", "c")]) == (
        "A    LONG HEADER  C\nxyz  1\n     22           c"
    )


def test_version_is_printed_by_the_installed_command() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "rsub"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == f"rsub {sidecar.__version__}"


async def test_create_cursor_commits_zero_and_prints_the_cursor(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    code, out, err = await rsub(
        capsys, "create-cursor", STREAM, "orders-totals", "--sidecar", target
    )
    assert (code, err) == (0, "")
    assert out == "external cursor 'orders-totals' of stream 'orders' at 0\n"
    created = backend.subscriptions[STREAM]["orders-totals"]
    assert (created.kind, created.mark_delete) == (SubscriptionKind.EXTERNAL, 0)
    # Again on a cursor that moved on: left as it stands.
    backend.subscriptions[STREAM]["orders-totals"] = dataclasses.replace(created, mark_delete=9)
    code, out, _ = await rsub(
        capsys, "create-cursor", STREAM, "orders-totals", "--sidecar", target, "--json"
    )
    assert code == 0
    assert json.loads(out) == {"stream": STREAM, "subscription": "orders-totals", "mark_delete": 9}


async def test_reset_cursor_sets_a_cursor_backwards_and_refuses_a_durable(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    backend.make_cursor(SUBSCRIPTION)
    code, out, err = await rsub(
        capsys, "reset-cursor", STREAM, SUBSCRIPTION, "7", "--sidecar", target
    )
    assert (code, err) == (0, "")
    assert out == "external cursor 'billing' of stream 'orders' reset from 41 to 7\n"
    assert backend.subscriptions[STREAM][SUBSCRIPTION].mark_delete == 7
    code, out, _ = await rsub(
        capsys, "reset-cursor", STREAM, SUBSCRIPTION, "0", "--sidecar", target, "--json"
    )
    assert code == 0
    assert json.loads(out) == {
        "stream": STREAM,
        "subscription": SUBSCRIPTION,
        "previous_sequence": 7,
        "sequence": 0,
    }
    code, out, err = await rsub(capsys, "reset-cursor", STREAM, "audit", "3", "--sidecar", target)
    assert (code, out) == (1, "")
    assert err.startswith("error: NOT_FOUND: ") and "no external cursor 'audit'" in err
    assert backend.subscriptions[STREAM]["audit"].mark_delete == 3


@pytest.mark.parametrize("sequence", ["-1", "x", str(2**64)])
async def test_reset_cursor_takes_only_a_sequence(
    capsys: pytest.CaptureFixture[str], sequence: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        await rsub(capsys, "reset-cursor", STREAM, SUBSCRIPTION, sequence)
    assert exit_info.value.code == 2
    assert "expected a read-stream sequence (>= 0)" in capsys.readouterr().err


async def test_subscriptions_warn_of_a_durable_receiving_markers(
    grpc_server: GrpcServerHandle, capsys: pytest.CaptureFixture[str], backend: MemoryBackend
) -> None:
    target = f"127.0.0.1:{grpc_server.port}"
    audit = backend.subscriptions[STREAM]["audit"]
    backend.subscriptions[STREAM]["audit"] = dataclasses.replace(audit, receives_markers=True)
    code, out, err = await rsub(capsys, "subscriptions", STREAM, "--sidecar", target)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 4  # header, two rows, one warning
    assert lines[3] == (
        "warning: durable 'audit' receives the markers of stream 'orders': its filter lets "
        "them through; filter it on 'orders.>' (docs/topology.md)"
    )
    code, out, _ = await rsub(capsys, "subscriptions", STREAM, "--sidecar", target, "--json")
    assert code == 0
    flags = {s["subscription"]: s["receives_markers"] for s in json.loads(out)["subscriptions"]}
    assert flags == {"audit": True, "billing": False}
