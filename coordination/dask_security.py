"""How every ROSE process reaches a Dask scheduler: its address and, on a TLS cluster, the
client certificate of `stack.dask_tls`. The CLI, the launcher, the flows and the stack's checks
open their clients here (`DaskScheduler.client`, or `.task_runner` for Prefect's), so none of
them can forget the certificate. Tasks on workers reach the
scheduler through `worker_client`, with the certificate their worker was started with.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.config import DaskTLS
from coordination.errors import StackError

if TYPE_CHECKING:
    from distributed import Client, Security
    from prefect_dask import DaskTaskRunner


def security(tls: DaskTLS | None) -> Security | None:
    """distributed's Security for a client presenting `tls`'s certificate; None: plain TCP."""
    if tls is None:
        return None
    from distributed import Security

    # Only the client role: ROSE's processes never listen for Dask connections. Encryption
    # required: a tcp:// address is refused instead of talking in the clear.
    sec = Security(tls_ca_file=str(tls.ca_file), tls_client_cert=str(tls.cert_file),
                   tls_client_key=str(tls.key_file), require_encryption=True)
    try:  # load the files now: a key that is not the certificate's is named, not a failed connect
        sec.get_connection_args("client")
    except ssl.SSLError as e:
        raise StackError(f"stack.dask_tls: {tls.cert_file} with {tls.key_file} and CA "
                         f"{tls.ca_file}: {e.reason or e}") from None
    return sec


def _tls_in_dask_config() -> bool:
    """Dask's own config (DASK_DISTRIBUTED__COMM__TLS__*) names a client certificate, which
    distributed's Client uses when given no Security."""
    from distributed import Security

    return bool(Security().tls_client_cert)


@dataclass(frozen=True)
class DaskScheduler:
    """A scheduler's address and the TLS files to reach it with (None: plain TCP)."""

    address: str
    tls: DaskTLS | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of distributed's Client (and DaskTaskRunner's client_kwargs)."""
        if self.tls is None:
            if self.address.startswith("tls://") and not _tls_in_dask_config():
                raise StackError(f"the Dask scheduler at {self.address} speaks TLS: set "
                                 "stack.dask_tls (`rose cluster certs`, docs/cluster.md)")
            return {}
        if not self.address.startswith("tls://"):
            raise StackError(f"stack.dask_tls is set but the Dask scheduler at {self.address} is not "
                             "a tls:// address: start it with TLS (docs/cluster.md)")
        return {"security": security(self.tls)}

    def client(self, timeout: float = 30) -> Client:
        """A connected Client (use it as a context manager)."""
        from distributed import Client

        return Client(self.address, timeout=timeout, **self.client_kwargs())

    def task_runner(self) -> DaskTaskRunner:
        """Prefect's task runner on this scheduler, connecting as `client` does."""
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=self.address, client_kwargs=self.client_kwargs())
