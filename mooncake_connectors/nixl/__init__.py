"""NIXL backend plugin ``MooncakeCore``: NIXL transfers on mooncake-core's Transfer Engine.

``csrc/`` holds the C++ plugin (built on the target machine by ``mooncake_nixl_plugin
install``), ``backend`` the Python adapter it calls, ``abi`` / ``locate`` / ``build`` / ``cli``
the installer. Targets nixl 1.5.1 (see docs/nixl.md).
"""
