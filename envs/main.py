"""Entry point of the env service process: an EnvPool served over ZeroMQ (envs/service.py).

    python -m envs.main --bind tcp://127.0.0.1:5555 --env frozenlake --env-workers 2 \\
        --envs-per-worker 4 [--set key=value ...] [--curve DIR]

The pool's flags are envs/config.py's ``EnvPoolConfig`` fields, the names the run's ``actors``
group uses (``--env-workers`` is ``actors.env_workers``). ``--env`` is a registry name
(envs/registry.py: its configs/env/<name>.yaml gives the defaults) or an importable
"module:callable"; each ``--set`` overrides one setting, its value read as JSON
when it parses (numbers, booleans, null, lists), else as a string.
``--env-latency-s S`` answers every reset and step S seconds late, as a remote simulator would
(the wait holds no worker: envs/service.py's ``LatencyEnvClient``), for latency benchmarks.
``--curve DIR`` requires CurveZMQ keys of its clients (transport/security.py; the run's
``actors.env_curve=DIR`` gives the actors theirs); a network address (not loopback) is served
only with ``--curve`` or, knowingly, ``--insecure``. Prints ``env service on <address>`` once it
serves (the real port when binding ``:*``).
SIGTERM or SIGINT: finish in-flight requests, close the socket, then stop every worker.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import json
import signal

from envs.config import EnvPoolConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m envs.main", description=__doc__.splitlines()[0])
    p.add_argument("--bind", default="tcp://127.0.0.1:5555", help="ZeroMQ address to serve on")
    p.add_argument("--env", required=True, help='registry name, or "module:callable"')
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="env config")
    p.add_argument("--curve", metavar="DIR", help="require CurveZMQ: the server certificate and "
                   "the allowed clients' in DIR (python -m transport.security DIR makes a set)")
    p.add_argument("--insecure", action="store_true",
                   help="serve a network address without --curve (anyone who reaches it may play)")
    for f in dataclasses.fields(EnvPoolConfig):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"actors.{f.name} in a run (default: {f.default})")
    return p.parse_args(argv)


def parse_sets(items: list[str]) -> dict:
    config = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    return config


def _loopback(address: str) -> bool:
    """``address`` (tcp://host:port, ipc://, inproc://) is reachable from this machine only."""
    if not address.startswith("tcp://"):
        return True
    host = address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def serve(pool, address: str, curve_dir: str | None = None, latency_s: float = 0.0) -> None:
    from envs.service import EnvServer, LatencyEnvClient, LocalEnvClient
    from transport.security import read_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = LocalEnvClient(pool)
    if latency_s:
        client = LatencyEnvClient(client, latency_s)
    server = EnvServer(client, pool.num_slots, address,
                       curve=None if curve_dir is None else read_server(curve_dir))
    print(f"env service on {server.address}{' (CurveZMQ)' if curve_dir else ''}", flush=True)
    try:
        await server.serve(stop)
    finally:
        server.close()
        await client.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not (args.curve or args.insecure or _loopback(args.bind)):
        raise SystemExit(f"--bind {args.bind} serves the network: give --curve DIR (CurveZMQ keys, "
                         "python -m transport.security DIR makes them) or --insecure")
    from envs.pool import EnvPool
    from envs.registry import resolve_config

    config = resolve_config(args.env, parse_sets(args.set))
    pool_cfg = EnvPoolConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EnvPoolConfig)})
    with EnvPool((args.env, config), num_workers=pool_cfg.env_workers,
                 envs_per_worker=pool_cfg.envs_per_worker, step_timeout_s=pool_cfg.step_timeout_s,
                 reset_timeout_s=pool_cfg.reset_timeout_s,
                 start_timeout_s=pool_cfg.start_timeout_s) as pool:
        asyncio.run(serve(pool, args.bind, args.curve, pool_cfg.env_latency_s))


if __name__ == "__main__":
    main()
