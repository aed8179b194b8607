"""``make_cluster``: the topology a run config names, not started.

Called by the training loop (launch/run/loop.py). The only module that knows both backends; a
backend is imported when chosen, so a ``topology=local`` run never imports Ray.
"""

from __future__ import annotations

from launch.config.schema import RunConfig
from launch.topology.protocol import Cluster


def make_cluster(cfg: RunConfig) -> Cluster:
    """The ``cfg.topology`` cluster (nothing started yet)."""
    if cfg.topology == "local":
        from launch.topology.local_cluster import LocalCluster

        return LocalCluster(cfg)
    from launch.topology.ray_cluster import RayCluster  # imports Ray

    return RayCluster(cfg)
