"""GPU memory for the Transfer Engine: the ``cuda`` plugin (docs/gpu.md).

* ``runtime.py`` -- :class:`CudaCopier`, the device-copy interface of ``device_memory`` over
  NVIDIA's ``cuda-python`` (``cuda.bindings``): async copies on streams, pinned host buffers,
  pointer attributes, IPC handles. Imported only when an engine is built on a machine that has
  ``cuda.bindings``; the CPU-only install path never imports CUDA.
* ``ipc.py`` -- :class:`CudaIpcTransport`: same-host peers whose registered memory is all on a
  GPU, device to device through CUDA IPC handles published in the segment descriptor.

With the plugin loaded, ``cuda:N`` regions (and ``*`` on a device pointer) register; tcp and cma
carry them through pinned staging buffers (``transfer/staging.py``), the in-process transport
through the copier.
"""
