"""CURVE keys: created once with private modes, loaded, required only beyond loopback."""

import os
import stat
from pathlib import Path

import pytest
import zmq

from prism_debug.bus import keys
from prism_debug.bus.keys import KeysError
from prism_debug.errors import PrismError


@pytest.fixture
def directory(tmp_path, monkeypatch):
    path = tmp_path / "curve"
    monkeypatch.setenv(keys.ENV_VAR, str(path))
    return path


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_directory_follows_the_override_then_xdg_config(monkeypatch, tmp_path):
    monkeypatch.setenv(keys.ENV_VAR, str(tmp_path / "k"))
    assert keys.keys_dir() == tmp_path / "k"
    monkeypatch.delenv(keys.ENV_VAR)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/etc/me")
    assert keys.keys_dir() == Path("/etc/me/prism-debug/curve")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert keys.keys_dir() == tmp_path / "home/.config/prism-debug/curve"


def test_ensure_keys_creates_private_pairs_once(directory):
    paths = keys.ensure_keys()
    assert paths.directory == directory
    assert sorted(os.listdir(directory)) == ["client.key", "client.key_secret", "server.key",
                                             "server.key_secret"]
    assert mode(directory) == 0o700
    assert (mode(paths.server_secret), mode(paths.client_secret)) == (0o600, 0o600)
    assert (mode(paths.server_public), mode(paths.client_public)) == (0o644, 0o644)
    server, client = keys.load_server(), keys.load_client()
    assert len(server[0]) == len(server[1]) == 40 and server != client
    assert zmq.curve_public(server[1]) == server[0]  # the pair belongs together

    before = {p: p.read_bytes() for p in directory.iterdir()}
    assert keys.ensure_keys() == paths
    assert {p: p.read_bytes() for p in directory.iterdir()} == before
    assert (keys.load_server(), keys.load_client()) == (server, client)


def test_ensure_keys_remakes_only_a_broken_pair(directory):
    paths = keys.ensure_keys()
    server = keys.load_server()
    paths.client_secret.unlink()
    keys.ensure_keys()
    assert keys.load_server() == server and paths.client_secret.is_file()
    assert sorted(os.listdir(directory)) == ["client.key", "client.key_secret", "server.key",
                                             "server.key_secret"]


def test_missing_keys_say_how_to_make_them(directory):
    with pytest.raises(KeysError) as raised:
        keys.load_client()
    assert isinstance(raised.value, PrismError)
    assert str(raised.value) == (f"no usable CURVE client keys in {directory} (Invalid "
                                 f"certificate file: {directory}/client.key_secret): run "
                                 "prism-debug keys to create them")


@pytest.mark.parametrize("endpoint", [
    "127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]:5555",
    "tcp://127.0.0.1:5555", "tcp://127.0.0.1:*", "tcp://localhost:5555", "tcp://[::1]:5555",
    "tcp://[::ffff:127.0.0.1]:1", "127.0.0.1:5555", "ipc:///tmp/prism.sock",
    "inproc://bus", "tcp://10.0.0.1;127.0.0.1:5555"])
def test_loopback_endpoints(endpoint):
    assert keys.is_loopback(endpoint) is True


@pytest.mark.parametrize("endpoint", [
    "0.0.0.0", "tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.1.2.3:5555", "10.1.2.3",
    "tcp://[::]:5555", "::", "tcp://eth0:5555", "tcp://gpu-node-7:5555", "128.0.0.1",
    "tcp://127.0.0.1;10.0.0.1:5555"])
def test_endpoints_other_machines_can_reach(endpoint):
    assert keys.is_loopback(endpoint) is False


def test_a_bind_beyond_loopback_needs_the_server_keys(directory):
    assert keys.server_keys_for("tcp://127.0.0.1:5555") is None
    with pytest.raises(KeysError) as raised:
        keys.server_keys_for("tcp://0.0.0.0:5555")
    assert str(raised.value) == (f"binding the bus to tcp://0.0.0.0:5555 (not loopback) needs "
                                 f"CURVE keys and {directory} has none: run prism-debug keys "
                                 "to create them")
    keys.ensure_keys()
    assert keys.server_keys_for("tcp://0.0.0.0:5555") == keys.load_server()


def test_apply_sets_the_curve_options(directory):
    keys.ensure_keys()
    server, client = keys.load_server(), keys.load_client()
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    try:
        keys.apply_server(router, server)
        keys.apply_client(dealer, client, server[0].decode())  # str or bytes
        # (the key options are write-only; test_client checks a real CURVE round trip)
        assert (router.curve_server, router.mechanism) == (1, zmq.CURVE)
        assert (dealer.curve_server, dealer.mechanism) == (0, zmq.CURVE)
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        context.term()
