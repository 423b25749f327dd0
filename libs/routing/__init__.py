"""Adapter-affinity routing: pure functions and small classes, no I/O (shared by gateway and simulator)."""

from libs.routing.bounded_load import (
    DEFAULT_BALANCE_FACTOR,
    DEFAULT_HOT_THRESHOLD,
    DEFAULT_MAX_SPREAD,
    BoundedLoadRouter,
    NoWorkersError,
    RouteDecision,
    load_bound,
)
from libs.routing.hashing import DEFAULT_VNODES, HashRing, stable_hash64
from libs.routing.policies import (
    POLICY_NAMES,
    BoundedLoadPolicy,
    ClusterView,
    ConsistentHashPolicy,
    GieLoraAffinityPolicy,
    LeastLoadedPolicy,
    RandomPolicy,
    RayMultiplexPolicy,
    RoutingPolicy,
    make_policy,
)

__all__ = [
    "DEFAULT_BALANCE_FACTOR",
    "DEFAULT_HOT_THRESHOLD",
    "DEFAULT_MAX_SPREAD",
    "DEFAULT_VNODES",
    "POLICY_NAMES",
    "BoundedLoadPolicy",
    "BoundedLoadRouter",
    "ClusterView",
    "ConsistentHashPolicy",
    "GieLoraAffinityPolicy",
    "HashRing",
    "LeastLoadedPolicy",
    "NoWorkersError",
    "RandomPolicy",
    "RayMultiplexPolicy",
    "RouteDecision",
    "RoutingPolicy",
    "load_bound",
    "make_policy",
    "stable_hash64",
]
