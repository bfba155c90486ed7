"""A real Redis Sentinel deployment on this machine: a primary, a replica and three sentinels
(`redis-server --sentinel`), each on a free port, for the tests of a failover. The sentinels call a primary down
after one second unless told otherwise, so a SIGKILLed primary is replaced within a few. (Never SIGSTOP a sentinel
to slow a failover: one that finds its clock jumped enters TILT mode and does nothing for 30 s.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from devtools import services

MASTER_NAME = "pidispatch"
DOWN_AFTER_MS = 1000


class SentinelGroup:
    def __init__(self, folder: Path, bind: str = "127.0.0.1", down_after_ms: int = DOWN_AFTER_MS):
        self.folder = folder
        self.down_after_ms = down_after_ms
        self.bind = bind
        self.ports = [services.free_port() for _ in range(2)]
        self.redis_services: dict[int, services.Service] = {}
        self.sentinels: list[services.Service] = []
        self.sentinel_ports: list[int] = []

    def start(self) -> SentinelGroup:
        primary, replica = self.ports
        self._start_redis(primary)
        self._start_redis(replica)
        redis.Redis(self.bind, replica).replicaof(self.bind, primary)
        services.wait_until(lambda: self.replication(replica).get("master_link_status") == "up", 30,
                            "the replica's link", self.folder / str(replica) / "redis.log")
        binary = services.ensure_package("redis-server", "redis-server")
        for index in range(3):
            port = services.free_port()
            config = self.folder / f"sentinel-{index}.conf"
            config.write_text(f"port {port}\nbind {self.bind}\ndir {self.folder}\nprotected-mode no\n"
                              f"logfile {self.folder / f'sentinel-{index}.log'}\n"
                              f"sentinel monitor {MASTER_NAME} {self.bind} {primary} 2\n"
                              f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                              f"sentinel failover-timeout {MASTER_NAME} 10000\n")
            self.sentinels.append(services.Service("sentinel", services.spawn([binary, str(config), "--sentinel"])))
            self.sentinel_ports.append(port)
        services.wait_until(self._sentinels_agree, 30, "three sentinels that see the replica",
                            self.folder / "sentinel-0.log")
        return self

    def _start_redis(self, port: int):
        # Loopback too: start_redis waits for an answer there.
        bind = ("127.0.0.1",) if self.bind == "127.0.0.1" else ("127.0.0.1", self.bind)
        self.redis_services[port] = services.start_redis(self.folder / str(port), port, persistent=True, bind=bind,
                                                         fsync="everysec")

    def _sentinels_agree(self) -> bool:
        try:
            return all(redis.Redis(self.bind, port, socket_timeout=1).sentinel_slaves(MASTER_NAME)
                       and redis.Redis(self.bind, port, socket_timeout=1).sentinel_master(MASTER_NAME)
                       .get("num-other-sentinels") == 2 for port in self.sentinel_ports)
        except redis.RedisError:
            return False

    # what the tests read and do

    @property
    def sentinels_setting(self) -> str:
        return ",".join(f"{self.bind}:{port}" for port in self.sentinel_ports)

    def env(self, db: int = 0) -> dict[str, str]:
        """What a process is given to find the primary through the sentinels (REDIS_URL's host is not used)."""
        return {"REDIS_SENTINELS": self.sentinels_setting, "REDIS_SENTINEL_MASTER": MASTER_NAME,
                "REDIS_URL": f"redis://nowhere.invalid:1/{db}"}

    def primary_port(self) -> int:
        host, port = redis.Redis(self.bind, self.sentinel_ports[0]).sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(self.bind, port, socket_timeout=2)

    def replication(self, port: int) -> dict:
        try:
            return self.client(port).info("replication")
        except redis.RedisError:
            return {}

    def kill_primary(self) -> int:
        """SIGKILL the primary (no chance to hand anything over); its port."""
        port = self.primary_port()
        process = self.redis_services[port].process
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        return port

    def wait_for_new_primary(self, old: int, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port != old and self.replication(port).get("role") == "master":
                return port
            time.sleep(0.1)
        raise AssertionError(f"no new primary within {timeout} s (see {self.folder}/sentinel-*.log)")

    def stop(self):
        for service in [*self.sentinels, *self.redis_services.values()]:
            service.stop()
