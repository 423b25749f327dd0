"""Message contracts: every subject name and every message type, in one place.

Services depend on this package and on nothing of each other's.
"""

from libs.contracts import subjects
from libs.contracts.messages import *  # noqa: F403
from libs.contracts.messages import __all__ as _messages_all
from libs.contracts.placement import *  # noqa: F403
from libs.contracts.placement import __all__ as _placement_all

__all__ = ["subjects", *_messages_all, *_placement_all]
