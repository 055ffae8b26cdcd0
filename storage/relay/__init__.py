"""The weight relay: a key -> bytes store trainers push to and workers pull from. base.py (the
contract), filesystem.py and mooncake.py (implementations; mooncake_client.py sets a Mooncake
client up, mooncake_pool.py holds the memory a client shares with the stack's store client),
pool.py (make_relay by kind, one shared client per process). Imports nothing else of storage
but atomic.py.
"""
