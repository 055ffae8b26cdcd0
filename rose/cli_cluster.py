"""`rose cluster ...`: what cluster mode needs besides addresses (docs/cluster.md)."""
from __future__ import annotations

from pathlib import Path

import typer

from rose.cli_errors import clear_errors, console

cluster_app = typer.Typer(help="Cluster mode: an existing Dask scheduler and Prefect server "
                          "(docs/cluster.md).", no_args_is_help=True)


@cluster_app.command("certs")
@clear_errors
def certs(directory: Path = typer.Argument(..., help="Where to write the CA and the certificates."),
          days: int = typer.Option(365, min=1, help="Days each certificate is valid."),
          force: bool = typer.Option(False, help="Replace existing files (certificates of the old "
                                     "CA stop working).")) -> None:
    """A CA and TLS certificates for the Dask scheduler, workers and clients (keys mode 0600)."""
    from rose.stack.certs import ROLES, make_certs, usage

    files = make_certs(directory, days=days, force=force)
    console.print(f"wrote {files.directory}:", highlight=False)
    console.print(f"  {files.ca.name}  the CA (copy it to every machine), key {files.key('ca').name} "
                  "(keep it on this one)", highlight=False)
    for role in ROLES:
        console.print(f"  {files.cert(role).name}, {files.key(role).name}  the {role}'s",
                      highlight=False)
    console.print("use them (replace $HEAD with the scheduler's address):", highlight=False)
    print(usage(files))  # plain: to be copied into a shell or a config file
