"""transport/security.py: CurveZMQ keys made per run or read from certificate files, a server that
lets in only its allowed clients and counts each refused handshake by reason, over real sockets."""

from __future__ import annotations

import time

import pytest
import zmq

from transport import security


def test_certificate_files_round_trip_and_the_server_allows_every_client_there(tmp_path, capsys):
    assert security.main([str(tmp_path / "keys")]) == 0
    assert "client.key_secret" in capsys.readouterr().out
    server, client = security.read_server(tmp_path / "keys"), security.read_client(tmp_path / "keys")
    assert server.allowed == (client.public,) and client.server_public == server.public
    assert len(server.secret) == len(client.secret) == 40  # Z85 of 32 bytes
    zmq.auth.create_certificates(str(tmp_path / "keys"), "second")  # one more actor's key
    second = security.read_client(tmp_path / "keys", "second")
    assert set(security.read_server(tmp_path / "keys").allowed) == {client.public, second.public}


def test_secrets_stay_out_of_reprs_and_a_server_needs_an_allow_list(tmp_path):
    server, client = security.generate()
    assert server.secret not in repr(server) and client.secret not in repr(client)
    assert server.allowed == (client.public,) and server.public == client.server_public
    with pytest.raises(ValueError, match="clients it lets in"):
        security.CurveServer(zmq.Context.instance().socket(zmq.ROUTER),
                             security.ServerKeys(server.public, server.secret, ()))
    with pytest.raises(FileNotFoundError, match="python -m transport.security"):
        security.read_server(tmp_path)
    (tmp_path / "x").mkdir()
    zmq.auth.create_certificates(str(tmp_path / "x"), "server")
    with pytest.raises(ValueError, match="no client certificate"):
        security.read_server(tmp_path / "x")


def test_each_kind_of_stranger_is_refused_and_counted():
    context = zmq.Context()
    server_keys, client_keys = security.generate()
    socket = context.socket(zmq.ROUTER)
    socket.linger = 0
    server = security.CurveServer(socket, server_keys)
    address = f"tcp://127.0.0.1:{socket.bind_to_random_port('tcp://127.0.0.1')}"
    other = security.generate()[1]
    clients = {
        "good": client_keys,
        "no_curve": None,
        "unknown_key": security.ClientKeys(other.public, other.secret, client_keys.server_public),
        "bad_handshake": security.ClientKeys(client_keys.public, client_keys.secret, other.server_public),
    }
    sockets = []
    try:
        for name, keys in clients.items():
            s = context.socket(zmq.DEALER)
            s.linger = 0
            if keys is not None:
                security.curve_client(s, keys)
            s.connect(address)
            s.send(name.encode())
            sockets.append(s)
        heard, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline and not (
                heard and all(server.drain()[k] >= 1 for k in clients if k != "good")):
            if socket.poll(50):
                heard.append(socket.recv_multipart()[-1])
        assert heard == [b"good"]
        # at least once each (a refused socket may try again, and each try counts)
        assert min(server.refused[k] for k in ("unknown_key", "no_curve", "bad_handshake")) >= 1
        assert set(server.refused) == {"unknown_key", "no_curve", "bad_handshake"}
    finally:
        for s in sockets:
            s.close()
        server.close()
        socket.close()
        context.term()
