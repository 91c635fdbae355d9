"""``python -m scrapesync.drill``: the Procfile's processes under faults for a while, then the exact
end state checked within a deadline.

In a folder of its own the drill starts a private PostgreSQL and Redis, the simulated Cloud (in
this process) and a local receiver as the dataset's destination; it runs ``release`` once, then
``web`` under gunicorn and two ``worker``s exactly as the Procfile says, starting again any that
ends, as a process manager would. A Cloud job finishes every 10-30 s (some notified several times,
some notifications lost) and a random fault (``scrapesync.faults``) strikes every 20-60 s. Then the
faults stop, and within the deadline every job must be synced, stored once, decided, published
and announced (``scrapesync.endstate``). It prints a short report and exits 1 on any miss.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from scrapesync import endstate, faults
from scrapesync.processes import DeadlineError, Deployment, Supervisor
from scrapesync.receiver import Receiver
from scrapesync.servers import PrivatePostgres, PrivateRedis, ServerError
from simulator import CloudState, serve
from sync.states import EvaluationOutcome

DATASET = "drill"
TOKEN = "drill-cloud-token"  # noqa: S105 - the simulator's token, valid nowhere else
SECRET_VARIABLE = "SCRAPESYNC_DRILL_HOOK_SECRET"  # noqa: S105 - a variable name, not a secret
SLOTS = {"web": "web", "worker-1": "worker", "worker-2": "worker"}

DATASETS_TOML = """# The drill's datasets file (written by python -m scrapesync.drill).
[datasets.{dataset}]
sitemap = "{dataset}"
entity_key = ["sku"]
window = "job"
partition = "retailer"
required = ["sku", "price"]

[datasets.{dataset}.quality]
parsers = {{ price = "number" }}

[[datasets.{dataset}.destinations]]
url = "{receiver}"
secret_env = "{secret_variable}"
"""


@dataclass(frozen=True)
class Options:
    """How long and how hard a drill runs, and the deployment's timings under it."""

    minutes: float = 2.0
    records: int = 2000
    jobs_every: tuple[float, float] = (10.0, 30.0)
    faults_every: tuple[float, float] = (20.0, 60.0)
    deadline: float = 120.0
    seed: int = 0
    kinds: tuple[str, ...] = tuple(faults.FAULTS)
    repeat_share: float = 0.25  # jobs whose notification Cloud sends again, 1-5 more times
    lost_share: float = 0.1  # jobs whose notification never leaves Cloud
    jobs: int | None = None  # no more jobs after this many (the faults go on)
    sweep: float = 10.0
    lease: float = 30.0
    reconcile: float = 60.0
    api_budget: int = 1000


@dataclass
class Report:
    """What a drill did and found."""

    seed: int
    jobs: dict[int, int] = field(default_factory=dict)
    notified_again: int = 0
    notifications_lost: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    restarts: dict[str, int] = field(default_factory=dict)
    settled_after: float | None = None
    end: endstate.EndState = field(default_factory=endstate.EndState)
    # from the workers' logs: per run, the evaluations that judged it and its committed syncs
    judged: Counter[str] = field(default_factory=Counter)
    committed: Counter[str] = field(default_factory=Counter)

    def extra_evaluations(self) -> int:
        """Evaluations beyond one per committed sync of their run."""
        return sum(max(0, n - self.committed[run]) for run, n in self.judged.items())

    def lines(self) -> list[str]:
        """The report as a user reads it."""
        records = sum(self.jobs.values())
        struck = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none"
        restarted = ", ".join(f"{k} {n}" for k, n in self.restarts.items() if n) or "none"
        settled = f"{self.settled_after:.1f} s" if self.settled_after is not None else "never"
        counts = ", ".join(f"{k} {v}" for k, v in self.end.counts.items())
        verdict = "OK" if self.end.holds else f"FAILED ({len(self.end.misses)} misses)"
        return [
            f"drill (seed {self.seed}): {len(self.jobs)} Cloud jobs, {records} records; "
            f"{self.notified_again} notified again, {self.notifications_lost} not notified",
            f"faults: {sum(self.faults.values())} ({struck})",
            f"restarts: {restarted}",
            f"end state after the last fault: {settled}",
            f"found: {counts}",
            f"evaluations that judged a run: {sum(self.judged.values())} for "
            f"{sum(self.committed.values())} committed syncs; beyond one per sync: "
            f"{self.extra_evaluations()}",
            *(f"MISS: {miss}" for miss in self.end.misses),
            f"result: {verdict}",
        ]

    def as_json(self) -> dict[str, Any]:
        """The report as plain data (``--report``)."""
        return {
            "ok": self.end.holds,
            "seed": self.seed,
            "jobs": len(self.jobs),
            "records": sum(self.jobs.values()),
            "notified_again": self.notified_again,
            "notifications_lost": self.notifications_lost,
            "faults": dict(self.faults),
            "restarts": self.restarts,
            "evaluations": sum(self.judged.values()),
            "committed_syncs": sum(self.committed.values()),
            "evaluations_beyond_one_per_sync": self.extra_evaluations(),
            "settled_after": self.settled_after,
            "counts": self.end.counts,
            "misses": self.end.misses,
        }


def _env(options: Options, folder: Path, postgres: str, redis: str, sim: str) -> dict[str, str]:
    """The environment of every process of the drill's deployment."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "DATABASE_URL": postgres,
        "REDIS_URL": redis,
        "WEBSCRAPER_API_URL": sim,
        "WEBSCRAPER_API_TOKEN": TOKEN,
        "WEBHOOK_TOKEN": secrets.token_urlsafe(18),
        "SCRAPESYNC_DATASETS": str(folder / "datasets.toml"),
        "SCRAPESYNC_SWEEP_SECONDS": str(options.sweep),
        "SCRAPESYNC_LEASE_SECONDS": str(options.lease),
        "SCRAPESYNC_RECONCILE_SECONDS": str(options.reconcile),
        "SCRAPESYNC_API_BUDGET": str(options.api_budget),
        "SCRAPESYNC_SHUTDOWN_GRACE_SECONDS": "5",
        SECRET_VARIABLE: secrets.token_urlsafe(24),
    }


class Drill:
    """One drill: the ground it stands on, the job and fault loops, and the final check."""

    def __init__(self, options: Options, folder: Path, echo: Callable[[str], None]) -> None:
        self.options = options
        self.folder = folder
        self.echo = echo
        self.rng = random.Random(options.seed)
        self.report = Report(seed=options.seed)
        self.started = time.monotonic()
        self.pg_folder: Path | None = None
        self._stop = threading.Event()
        self._cleanup: list[Callable[[], None]] = []

    def say(self, line: str) -> None:
        """Print one progress line, stamped with the drill's clock."""
        elapsed = time.monotonic() - self.started
        self.echo(f"[{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {line}")

    def run(self) -> Report:
        """Stand the deployment up, run the loops for the drill's minutes, heal, check."""
        try:
            ground = self._stand_up()
            loops = [
                threading.Thread(target=self._make_jobs, args=(ground,), daemon=True),
                threading.Thread(target=self._strike, args=(ground,), daemon=True),
            ]
            for loop in loops:
                loop.start()
            self._stop.wait(self.options.minutes * 60)
            self._stop.set()
            for loop in loops:
                loop.join()
            faults.heal(ground)
            self.say("faults stopped; waiting for the end state")
            self._settle(ground)
            self.report.restarts = dict(ground.supervisor.restarts)
            self.report.judged, self.report.committed = _work_logged(self.folder)
            return self.report
        finally:
            for step in reversed(self._cleanup):
                try:
                    step()
                except Exception as exc:  # cleaning up must go on, whatever one step meets
                    self.echo(f"cleanup: {type(exc).__name__}: {exc}")

    def _stand_up(self) -> faults.Ground:
        # its own temporary folder, which the postgres user can reach whoever owns the drill's;
        # kept after a miss, for a look at what the database holds
        pg_folder = self.pg_folder = Path(tempfile.mkdtemp(prefix="scrapesync-drill-pg-"))
        self._cleanup.append(
            lambda: shutil.rmtree(pg_folder, ignore_errors=True) if self.report.end.holds else None
        )
        postgres = PrivatePostgres(pg_folder, max_connections=40)
        postgres.create(migrate=False)
        self._cleanup.append(lambda: postgres.stop("immediate"))
        redis = PrivateRedis()
        redis.start()
        self._cleanup.append(lambda: redis.kill() if redis.running() else None)
        secret = secrets.token_urlsafe(24)
        self.receiver = Receiver(secret)
        receiver_url = self.receiver.start()
        self._cleanup.append(self.receiver.stop)
        cloud = CloudState(api_token=TOKEN, rate_limit=self.options.api_budget)
        self._cleanup.append(cloud.close)
        self.sitemap = cloud.add_sitemap(DATASET, start_urls=["https://shop.example/"])
        simulator = serve(cloud)
        self._cleanup.append(simulator.shutdown)
        (self.folder / "datasets.toml").write_text(
            DATASETS_TOML.format(
                dataset=DATASET, receiver=receiver_url, secret_variable=SECRET_VARIABLE
            )
        )
        env = _env(self.options, self.folder, postgres.url, redis.url, simulator.api_url)
        env[SECRET_VARIABLE] = secret
        deployment = Deployment(self.folder)
        deployment.run("release", env)
        supervisor = Supervisor(deployment, env, SLOTS)
        self._cleanup.append(supervisor.stop)
        supervisor.start()
        notify_url = f"{supervisor.web_url}/webhooks/webscraper/{env['WEBHOOK_TOKEN']}"
        cloud.notify_url = notify_url
        self.uow = postgres.uow()
        self.say(f"deployment up in {self.folder}: web, 2 workers, PostgreSQL, Redis, Cloud")
        return faults.Ground(supervisor, postgres, redis, cloud, notify_url, self.rng)

    def _make_jobs(self, ground: faults.Ground) -> None:
        while not self._stop.is_set():
            if self.options.jobs is not None and len(self.report.jobs) >= self.options.jobs:
                return
            self._finish_job(ground)
            if self._stop.wait(self.rng.uniform(*self.options.jobs_every)):
                return

    def _finish_job(self, ground: faults.Ground) -> None:
        """One Cloud job scraped and finished; Cloud notifies it once, several times or never."""
        cloud, n = ground.cloud, self.options.records
        job_id = cloud.create_job(self.sitemap)
        cloud.set_generated(job_id, n, seed=job_id, start=job_id * n)
        roll = self.rng.random()
        with ground.lock:
            lost = roll < self.options.lost_share
            cloud.notify_url = None if lost else ground.intended_notify_url()
            cloud.run_job(job_id)
            cloud.notify_url = ground.intended_notify_url()
        self.report.jobs[job_id] = n
        if lost:
            self.report.notifications_lost += 1
        elif roll < self.options.lost_share + self.options.repeat_share:
            cloud.notify(job_id, times=self.rng.randint(1, 5))
            self.report.notified_again += 1

    def _strike(self, ground: faults.Ground) -> None:
        while not self._stop.wait(self.rng.uniform(*self.options.faults_every)):
            kind = self.rng.choice(self.options.kinds)
            try:
                done = faults.FAULTS[kind](ground)
            except Exception as exc:  # a fault that fails is reported; the drill goes on
                done = f"{kind} failed: {type(exc).__name__}: {exc}"
            self.report.faults[kind] += 1
            self.say(f"fault: {done}")

    def _settle(self, ground: faults.Ground) -> None:
        """Check the end state until it holds or the deadline passes."""
        healed = time.monotonic()
        while True:
            received, bad = self.receiver.snapshot()
            try:
                found = endstate.check(
                    self.uow,
                    self.report.jobs,
                    dataset=DATASET,
                    received=received,
                    bad_signatures=bad,
                )
            except Exception as exc:  # the database may still be coming back
                found = endstate.EndState(misses=[f"check failed: {type(exc).__name__}: {exc}"])
            self.report.end = found
            if found.holds and ground.supervisor.running():
                self.report.settled_after = time.monotonic() - healed
                return
            if time.monotonic() - healed > self.options.deadline:
                return
            time.sleep(1.0)


NOT_A_JUDGEMENT = {  # outcomes of an evaluation that wrote no verdict
    EvaluationOutcome.UNCHANGED,
    EvaluationOutcome.BUSY,
    EvaluationOutcome.WAITING,
    EvaluationOutcome.UNCONFIGURED,
}


def _work_logged(folder: Path) -> tuple[Counter[str], Counter[str]]:
    """From every worker log of the deployment: per run, the evaluations that judged it (wrote
    a verdict) and its committed syncs."""
    judged: Counter[str] = Counter()
    committed: Counter[str] = Counter()
    for path in sorted(folder.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut by a kill
                continue
            event, run = entry.get("event"), entry.get("run_id")
            if event == "run.evaluated" and entry.get("outcome") not in NOT_A_JUDGEMENT:
                judged[run] += 1
            elif event == "attempt.committed":
                committed[run] += 1
    return judged, committed


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return float(low), float(high or low)


@click.command()
@click.option("--minutes", type=float, default=2.0, show_default=True, help="How long faults run.")
@click.option("--records", type=int, default=2000, show_default=True, help="Records per job.")
@click.option("--jobs-every", default="10-30", show_default=True, help="Seconds between jobs.")
@click.option("--faults-every", default="20-60", show_default=True, help="Seconds between faults.")
@click.option("--deadline", type=float, default=120.0, show_default=True, help="Seconds to settle.")
@click.option("--faults", "kinds", default=",".join(faults.FAULTS), help="Fault kinds to draw.")
@click.option("--seed", type=int, default=None, help="Random seed (default: a new one).")
@click.option("--sweep", type=float, default=10.0, show_default=True, help="Sweep interval (s).")
@click.option("--lease", type=float, default=30.0, show_default=True, help="Lease (s).")
@click.option("--reconcile", type=float, default=60.0, show_default=True, help="Reconcile (s).")
@click.option("--jobs", type=int, default=None, help="Stop making jobs after this many.")
@click.option(
    "--lost-share", type=float, default=0.1, show_default=True, help="Notifications never sent."
)
@click.option(
    "--repeat-share", type=float, default=0.25, show_default=True, help="Jobs notified again."
)
@click.option("--folder", type=click.Path(path_type=Path), default=None, help="Where to work.")
@click.option("--keep", is_flag=True, help="Keep the folder (it is kept anyway on a miss).")
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None)
def main(**given: Any) -> None:
    """Run the Procfile's processes under random faults, then check the exact end state."""
    kinds = tuple(k for k in given["kinds"].split(",") if k)
    unknown = sorted(set(kinds) - set(faults.FAULTS))
    if unknown:
        raise click.BadParameter(f"unknown faults {unknown}; known: {', '.join(faults.FAULTS)}")
    options = Options(
        minutes=given["minutes"],
        records=given["records"],
        jobs_every=_span(given["jobs_every"]),
        faults_every=_span(given["faults_every"]),
        deadline=given["deadline"],
        seed=given["seed"] if given["seed"] is not None else secrets.randbelow(1_000_000),
        kinds=kinds,
        sweep=given["sweep"],
        lease=given["lease"],
        reconcile=given["reconcile"],
        jobs=given["jobs"],
        lost_share=given["lost_share"],
        repeat_share=given["repeat_share"],
    )
    folder = given["folder"] or Path(tempfile.mkdtemp(prefix="scrapesync-drill-"))
    folder.mkdir(parents=True, exist_ok=True)
    drill = Drill(options, folder, click.echo)
    try:
        report = drill.run()
    except (ServerError, DeadlineError, RuntimeError) as exc:
        click.echo(f"the drill could not stand its deployment up: {exc}", err=True)
        raise SystemExit(2) from None
    for line in report.lines():
        click.echo(line)
    if given["report_path"] is not None:
        given["report_path"].write_text(json.dumps(report.as_json(), indent=2))
    if report.end.holds and not given["keep"] and given["folder"] is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        click.echo(f"logs: {folder}")
    if not report.end.holds and drill.pg_folder is not None:
        click.echo(f"database cluster: {drill.pg_folder / 'data'} (pg_ctl start -D ... to look)")
    raise SystemExit(0 if report.end.holds else 1)


if __name__ == "__main__":
    main()
