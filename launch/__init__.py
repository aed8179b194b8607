"""Launch: entry points, config schema, placement, the Ray cluster, builders, checkpoints and dev tools."""
