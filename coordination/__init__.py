"""What a run reads and holds on a running stack, shared with every other run's driver.

stack_record.py (the stack's record, stack.json, and whether its parts are alive),
dask_security.py (the Dask scheduler's address and TLS), run_lease.py (one driver per run),
serving_leases.py (the serving workers runs borrow), coexec_groups.py (co-execution groups),
reward_pool_state.py (the reward pool's record), processes.py (a service's process record),
probes.py (does a service answer), errors.py (StackError). Starting and stopping the stack's
processes is rose/stack's; this package imports executors.policies, storage and core, never
tasks, flows or rose (lint-imports checks it).
"""
