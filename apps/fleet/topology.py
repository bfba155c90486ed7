"""Which Redis the fleet uses: the primary, its replicas and whether each is in sync, and (behind Sentinel) how many
sentinels answer. `doctor` and the fleet panel say it; a failover loses what no replica had received."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from apps.fleet.connection import sentinel_of, where

# A replica acknowledges its offset every second; one that has not for longer than this is behind.
IN_SYNC_LAG_SECONDS = 5


@dataclass(frozen=True)
class Replica:
    address: str
    state: str  # Redis's word: online, wait_bgsave, send_bulk
    lag_seconds: int | None

    @property
    def in_sync(self) -> bool:
        return self.state == "online" and self.lag_seconds is not None and self.lag_seconds <= IN_SYNC_LAG_SECONDS

    def __str__(self) -> str:
        return f"{self.address} ({'in sync' if self.in_sync else f'{self.state}, lag {self.lag_seconds} s'})"


@dataclass
class Topology:
    primary: str
    replicas: list[Replica] = field(default_factory=list)
    sentinels: int = 0  # how many are configured (0: no Sentinel)
    sentinels_answering: int = 0

    @property
    def in_sync(self) -> list[Replica]:
        return [replica for replica in self.replicas if replica.in_sync]

    def summary(self) -> str:
        replicas = ", ".join(map(str, self.replicas)) or "none"
        line = f"primary {self.primary}; replicas: {replicas}"
        if self.sentinels:
            line += f"; {self.sentinels_answering} of {self.sentinels} sentinels answer"
        return line

    def warnings(self) -> list[str]:
        """What puts acknowledged work at risk; only behind Sentinel (a single Redis is what it was asked to be)."""
        if not self.sentinels:
            return []
        found = []
        if not self.in_sync:
            found.append("no replica is in sync: a failover now would lose the jobs queued since the last one was, "
                         "or find no replica to promote")
        if self.sentinels_answering < self.sentinels:
            found.append(f"{self.sentinels - self.sentinels_answering} of {self.sentinels} sentinels do not answer: "
                         "a failover needs a majority of them")
        return found


def read(redis) -> Topology:
    """The topology as the primary and the sentinels report it; RedisError when the primary does not answer."""
    replication = redis.info("replication")
    replicas = [Replica(f"{value.get('ip')}:{value.get('port')}", str(value.get("state", "")),
                        _int_or_none(value.get("lag")))
                for key, value in sorted(replication.items())
                if key.startswith("slave") and isinstance(value, dict)]
    if not settings.REDIS_SENTINELS:
        return Topology(primary=where(), replicas=replicas)
    sentinel = sentinel_of(tuple(settings.REDIS_SENTINELS), settings.REDIS_SENTINEL_PASSWORD)
    host, port = sentinel.discover_master(settings.REDIS_SENTINEL_MASTER)
    return Topology(primary=f"{host}:{port}", replicas=replicas, sentinels=len(sentinel.sentinels),
                    sentinels_answering=sum(_answers(each) for each in sentinel.sentinels))


def _answers(sentinel_client) -> bool:
    try:
        return bool(sentinel_client.ping())
    except (RedisError, OSError):
        return False


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
