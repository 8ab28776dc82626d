"""The UCX transport (``protocol="rdma"``): one-sided transfers through UCX's UCP API.

* ``library.py`` -- which libucp (system / MOFED / HPC-X, NIXL's, the libucx wheel), said out loud;
* ``binding.py`` -- a thin typed ctypes binding of the UCP calls used;
* ``lanes.py`` -- pure helpers: device names, lanes UCX chose, the "no RDMA lane" message;
* ``transport.py`` -- the transport: context/worker/progress thread, keys, endpoints, deadlines.
"""
