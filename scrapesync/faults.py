"""The faults a drill injects into a running deployment, one function each: processes killed or
stopped as a platform does it, the database and Redis lost, and Cloud misbehaving through the
simulator's fault injection (``simulator.fault``). Each returns a line saying what it did."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scrapesync.processes import Supervisor, free_port
from scrapesync.servers import PrivatePostgres, PrivateRedis
from simulator import CloudState


@dataclass
class Ground:
    """What the faults strike: the supervised processes, the private servers and the
    simulated Cloud, whose notifications a spell of faults may lose."""

    supervisor: Supervisor
    postgres: PrivatePostgres
    redis: PrivateRedis
    cloud: CloudState
    notify_url: str
    rng: random.Random
    workers: tuple[str, ...] = ("worker-1", "worker-2")
    lost_until: float = 0.0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def intended_notify_url(self) -> str:
        """Where Cloud's notifications go now: the web process, or nowhere during a spell."""
        if time.monotonic() < self.lost_until:
            return f"http://127.0.0.1:{free_port()}/gone"
        return self.notify_url


def worker_sigkill(ground: Ground) -> str:
    """A whole worker dies at once (rq worker, its work horse and its scheduler)."""
    slot = ground.rng.choice(ground.workers)
    ground.supervisor.kill(slot)
    return f"{slot}: SIGKILL to every process"


def worker_sigterm(ground: Ground) -> str:
    """A worker is told to stop (every process of it, as Heroku does) and started again."""
    slot = ground.rng.choice(ground.workers)
    ground.supervisor.terminate(slot)
    return f"{slot}: SIGTERM to every process"


def web_sigkill(ground: Ground) -> str:
    """The web process dies at once, gunicorn and its workers."""
    ground.supervisor.kill("web")
    return "web: SIGKILL to every process"


def _postgres_restart(ground: Ground, mode: str) -> str:
    down = ground.rng.uniform(1.0, 5.0)
    ground.postgres.stop(mode)
    time.sleep(down)
    ground.postgres.start()
    return f"PostgreSQL stopped ({mode}), started again {down:.1f} s later"


def postgres_fast_restart(ground: Ground) -> str:
    """PostgreSQL stops (fast: sessions ended, a checkpoint) and starts again."""
    return _postgres_restart(ground, "fast")


def postgres_immediate_restart(ground: Ground) -> str:
    """PostgreSQL dies as in a crash (immediate: no checkpoint) and starts again."""
    return _postgres_restart(ground, "immediate")


def redis_kill_empty(ground: Ground) -> str:
    """Redis dies and comes back empty: every queued job, lock and schedule is gone."""
    down = ground.rng.uniform(0.5, 3.0)
    ground.redis.kill()
    time.sleep(down)
    ground.redis.start()
    return f"Redis SIGKILLed, started empty {down:.1f} s later"


def redis_flushall(ground: Ground) -> str:
    """Everything Redis holds is flushed at once."""
    ground.redis.client().flushall()
    return "Redis FLUSHALL"


def cloud_429_burst(ground: Ground) -> str:
    """Cloud answers 429 with Retry-After to the next requests."""
    times, wait = ground.rng.randint(3, 15), ground.rng.randint(1, 10)
    ground.cloud.inject_fault("rate_limit", times=times, retry_after=wait)
    return f"Cloud: 429 (Retry-After {wait} s) to the next {times} requests"


def cloud_5xx(ground: Ground) -> str:
    """Cloud answers a server error to the next requests."""
    times, status = ground.rng.randint(2, 10), ground.rng.choice((500, 502, 503))
    ground.cloud.inject_fault("status", times=times, status=status)
    return f"Cloud: {status} to the next {times} requests"


def cut_downloads(ground: Ground) -> str:
    """Cloud drops the next downloads part way through."""
    times, after = ground.rng.randint(1, 4), ground.rng.randint(1_000, 200_000)
    ground.cloud.inject_fault("cut", times=times, after_bytes=after)
    return f"Cloud: the next {times} downloads cut after {after} bytes"


def notifications_lost(ground: Ground) -> str:
    """For a spell, every notification Cloud sends (and its two retries) goes nowhere."""
    spell = ground.rng.uniform(10.0, 30.0)
    with ground.lock:
        ground.lost_until = time.monotonic() + spell
        ground.cloud.notify_url = ground.intended_notify_url()
    return f"Cloud: notifications lost for {spell:.0f} s"


FAULTS: dict[str, Callable[[Ground], str]] = {
    "worker-sigkill": worker_sigkill,
    "worker-sigterm": worker_sigterm,
    "web-sigkill": web_sigkill,
    "postgres-fast-restart": postgres_fast_restart,
    "postgres-immediate-restart": postgres_immediate_restart,
    "redis-kill-empty": redis_kill_empty,
    "redis-flushall": redis_flushall,
    "cloud-429": cloud_429_burst,
    "cloud-5xx": cloud_5xx,
    "cut-downloads": cut_downloads,
    "notifications-lost": notifications_lost,
}


def heal(ground: Ground) -> None:
    """End every fault: servers up, Cloud's faults disarmed and its notifications going to the
    web process again (the supervisor keeps the processes up by itself)."""
    with ground.lock:
        ground.lost_until = 0.0
        ground.cloud.notify_url = ground.notify_url
    ground.cloud.clear_faults()
    if not ground.redis.running():
        ground.redis.start()
