"""What a run reads and holds on a running stack, shared with every other run's driver.

dask_security.py (the Dask scheduler's address and TLS), run_lease.py (one driver per run),
serving_leases.py (the serving workers runs borrow), coexec_groups.py (co-execution groups),
errors.py (StackError). Starting and stopping the stack's processes is rose/stack's; this
package imports executors.policies, storage and core, never tasks, flows or rose.
"""
