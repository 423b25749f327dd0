"""A local stack of REAL servers (NATS JetStream, PostgreSQL, an S3 store) as plain processes on
loopback, no Docker. `lpx stack up|status|down` and the test suite's session fixture both use it."""

from libs.stack.launcher import Stack, StackConfig, StackError

__all__ = ["Stack", "StackConfig", "StackError"]
