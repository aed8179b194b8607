"""Entry point of the env service process: an EnvPool served over ZeroMQ (envs/service.py).

    python -m envs.main --bind tcp://127.0.0.1:5555 --env frozenlake --env-workers 2 \\
        --envs-per-worker 4 [--set key=value ...]

The pool's flags are envs/config.py's ``EnvPoolConfig`` fields, the names the run's ``actors``
group uses (``--env-workers`` is ``actors.env_workers``). ``--env`` is a registry name (envs/registry.py: its configs/env/<name>.yaml gives the defaults)
or an importable "module:callable"; each ``--set`` overrides one setting, its value read as JSON
when it parses (numbers, booleans, null, lists), else as a string.
Prints ``env service on <address>`` once it serves (the real port when binding ``:*``).
SIGTERM or SIGINT: finish in-flight requests, close the socket, then stop every worker.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal

from envs.config import EnvPoolConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m envs.main", description=__doc__.splitlines()[0])
    p.add_argument("--bind", default="tcp://127.0.0.1:5555", help="ZeroMQ address to serve on")
    p.add_argument("--env", required=True, help='registry name, or "module:callable"')
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="env config")
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


async def serve(pool, address: str) -> None:
    from envs.service import EnvServer, LocalEnvClient

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = LocalEnvClient(pool)
    server = EnvServer(client, pool.num_slots, address)
    print(f"env service on {server.address}", flush=True)
    try:
        await server.serve(stop)
    finally:
        server.close()
        await client.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from envs.pool import EnvPool
    from envs.registry import resolve_config

    config = resolve_config(args.env, parse_sets(args.set))
    pool_cfg = EnvPoolConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EnvPoolConfig)})
    with EnvPool((args.env, config), num_workers=pool_cfg.env_workers,
                 envs_per_worker=pool_cfg.envs_per_worker, step_timeout_s=pool_cfg.step_timeout_s,
                 reset_timeout_s=pool_cfg.reset_timeout_s) as pool:
        asyncio.run(serve(pool, args.bind))


if __name__ == "__main__":
    main()
