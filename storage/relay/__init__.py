"""The weight relay: a key -> bytes store trainers push to and workers pull from. base.py (the
contract), filesystem.py and mooncake.py (implementations), pool.py (make_relay by kind, one shared
client per process). Imports nothing else of storage but atomic.py.
"""
