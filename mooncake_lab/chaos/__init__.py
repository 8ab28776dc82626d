"""Building blocks of the chaos harness (``bench/robustness/chaos.py``) and the soak (``bench/robustness/soak.py``).

Pure logic (``payload``, ``oplog``, ``checker``, ``stats``) is stdlib-only and unit-tested
without processes (tests/chaos/); ``worker`` is the store client process and must run under
both this project's Python and the original Mooncake's venv, so it imports nothing of ours
except through ``mooncake_core.compat``; ``netlab``, ``cluster``, ``nemesis`` do the I/O.
"""
