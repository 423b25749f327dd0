"""Message contracts: every subject name and every message type, in one place.

Services depend on this package and on nothing of each other's.
"""

from libs.contracts import subjects
from libs.contracts.messages import *  # noqa: F403
from libs.contracts.messages import __all__ as _messages_all

__all__ = ["subjects", *_messages_all]
