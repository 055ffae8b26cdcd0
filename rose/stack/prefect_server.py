"""A local Prefect server: SQLite under the run directory, bound to 127.0.0.1, no analytics."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from coordination.errors import StackError
from coordination.probes import http_ok
from rose.stack.ports import LOCALHOST, pick_port
from rose.stack.prefect_database import database_path, save_template, seed_database, template_path
from rose.stack.process import ManagedProcess, venv_binary

START_TIMEOUT_S = 120.0  # ~10 s when idle (~17 s migrating a new database); the machine may be busy


@dataclass
class PrefectServer:
    api_url: str  # http://127.0.0.1:P/api
    home: Path  # PREFECT_HOME shared by the server, the driver and the workers
    process: ManagedProcess | None = field(default=None, repr=False)
    template: Path | None = None  # where to keep its new database once it answers

    def wait(self, timeout: float = START_TIMEOUT_S) -> "PrefectServer":
        """Block until /api/health answers (fails fast, with the log's last line, if it dies)."""
        if self.process is not None:
            self.process.wait_for_http(f"{self.api_url}/health", timeout=timeout)
            if self.template is not None:
                save_template(database_path(self.home), self.template)
                self.template = None
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=10)


def prefect_home(run_dir: Path) -> Path:
    return Path(run_dir).resolve() / "prefect"


def prefect_env(api_url: str, home: Path) -> dict[str, str]:
    """Env for Prefect clients (driver, Dask workers): never the ephemeral per-process server."""
    return {
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(home),
        # Persisted task results (what a resumed step reuses). Prefect 3.7 derives this from
        # ~/.prefect, not from PREFECT_HOME, so it must be set explicitly.
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(Path(home) / "storage"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true",
    }


def launch_prefect_server(run_dir: Path, port: int | None = None) -> PrefectServer:
    """Start `prefect server start` without waiting (it takes ~10 s: start the rest meanwhile)."""
    port = pick_port(port)
    home = prefect_home(run_dir)
    home.mkdir(parents=True, exist_ok=True)
    db, template = database_path(home), template_path()
    keep_as = None if db.exists() or seed_database(db, template) else template  # Prefect migrates it
    api_url = f"http://{LOCALHOST}:{port}/api"
    env = {
        **prefect_env(api_url, home),
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{db}",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",  # no access log line per task-run update
        "PREFECT_UI_API_URL": api_url,  # else the UI in the browser calls 127.0.0.1:4200
    }
    env.pop("PREFECT_API_URL")  # the server is not a client of itself
    proc = ManagedProcess("prefect-server", [
        venv_binary("prefect"), "server", "start", "--host", LOCALHOST, "--port", str(port),
        "--analytics-off", "--no-background"], run_dir, env=env)
    proc.env.pop("PREFECT_API_URL", None)  # an inherited one would point the server elsewhere
    proc.start()
    return PrefectServer(api_url, home, proc, template=keep_as)


def check_prefect(api_url: str) -> None:
    """Raise a one-line StackError unless an existing server answers at api_url."""
    if not http_ok(f"{api_url.rstrip('/')}/health"):
        raise StackError(f"Prefect server at {api_url} does not answer /health")
