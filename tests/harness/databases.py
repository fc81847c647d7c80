"""A Redis database of the session's server per owner: no two modules share one."""

from __future__ import annotations

import os

import redis

__all__ = ["own_database"]

#: owner -> database number, in the order they were claimed (0 is the session's shared database).
_CLAIMS: dict[str, int] = {}


def own_database(owner: str) -> str:
    """The URL of a database of the session's Redis that only ``owner`` gets (emptied when first claimed).

    ``owner`` names the user, e.g. ``f"{__name__}:workers"``: the same owner gets the same database, a new one
    the next free number — so a module's workers never take another module's messages.
    """
    base = os.environ["REDIS_URL"].rsplit("/", 1)[0]
    if owner not in _CLAIMS:
        number = len(_CLAIMS) + 1
        client = redis.Redis.from_url(f"{base}/0")
        available = int(client.config_get("databases").get("databases", 16))
        if number >= available:
            raise RuntimeError(f"the session's Redis has {available} databases; {owner!r} would be the {number}th owner")
        _CLAIMS[owner] = number
        redis.Redis.from_url(f"{base}/{number}").flushdb()
    return f"{base}/{_CLAIMS[owner]}"
