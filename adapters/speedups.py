"""Which compiled accelerators are in use: `broker.speedups`, which the adapters' twins load
through too (the broker has a twin of its own, and never imports the adapters)."""

from broker.speedups import ACCELERATORS, active, load

__all__ = ["ACCELERATORS", "active", "load"]
