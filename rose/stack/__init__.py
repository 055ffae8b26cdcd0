"""The local stack: Prefect server, Mooncake services, Dask scheduler and named workers."""
