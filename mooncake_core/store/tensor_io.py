"""Stored tensors to and from places other than host buffers: safetensors files, CUDA tensors.

``TensorIO`` is a delegate of ``MooncakeDistributedStore`` with the original's methods and
return conventions:

* ``save_tensor_to_safetensor(key, file_name=None)``: 0, or a negative code (-704 when the key
  holds no tensor, -600 when the file cannot be written); the file holds one tensor named
  ``key``. ``load_tensor_from_safetensor(key=None, file_name)``: the tensor read (and stored
  under ``key``, default the file name; a file without that name gives its first tensor, with
  a warning), or None. The files are written and read by the ``safetensors`` library -- the
  format's reference implementation, as the original uses, so files interoperate with every
  other safetensors user.
* ``get_tensor_into_cuda(key, tensor)`` / ``batch_get_tensor_into_cuda(keys, tensors)``: the
  stored tensor's elements into a preallocated CUDA tensor of the same dtype and element
  count; per key the bytes written or a negative code. A destination that is not a CUDA
  tensor (a CPU-only host) is refused with -600 and a message naming the missing GPU.
"""

from __future__ import annotations

from typing import Any

from mooncake_core.store.codes import INVALID, NOT_FOUND, OK
from mooncake_core.store.tensor_api import TensorApi
from mooncake_core.store.validate import check_key, check_keys
from mooncake_core.utils.log import get_logger

__all__ = ["TensorIO"]

log = get_logger("mooncake.store.tensor_io")


def _safetensors_torch() -> Any:
    try:
        import safetensors.torch as st
    except ImportError as e:
        raise ImportError("safetensors files need the 'safetensors' package: pip install safetensors "
                          "(or mooncake-core[torch])") from e
    return st


class TensorIO:
    def __init__(self, tensors: TensorApi) -> None:
        self.tensors = tensors

    # ------------------------------------------------------------------ safetensors
    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        key = check_key(key, "save_tensor_to_safetensor")
        if file_name is not None and not isinstance(file_name, str):
            raise TypeError(f"save_tensor_to_safetensor: file_name must be str or None, got {type(file_name).__name__}")
        tensor = self.tensors.get_tensor(key)
        if tensor is None:
            log.error("save_tensor_to_safetensor: no tensor stored under %r", key)
            return NOT_FOUND
        path = key if file_name is None else file_name
        try:
            _safetensors_torch().save_file({key: tensor.contiguous()}, path)
        except (OSError, ValueError, RuntimeError) as e:
            log.error("save_tensor_to_safetensor %r -> %s: %s", key, path, e)
            return INVALID
        return OK

    def load_tensor_from_safetensor(self, key: str | None = None, file_name: str | None = None) -> Any:
        if not isinstance(file_name, str) or not file_name:
            raise TypeError("load_tensor_from_safetensor: file_name (a path) is required")
        if key is not None:
            key = check_key(key, "load_tensor_from_safetensor")
        try:
            loaded = _safetensors_torch().load_file(file_name)
        except (OSError, ValueError, RuntimeError, Exception) as e:  # safetensors raises its own error type
            log.error("load_tensor_from_safetensor: cannot read %s: %s", file_name, e)
            return None
        if not loaded:
            log.error("load_tensor_from_safetensor: no tensor in %s", file_name)
            return None
        store_key = file_name if key is None else key
        name = store_key if store_key in loaded else next(iter(loaded))
        if key is not None and name != key:
            log.warning("load_tensor_from_safetensor: %s has no tensor named %r; using its first one, %r",
                        file_name, key, name)
        tensor = loaded[name]
        rc = self.tensors.put_tensor(store_key, tensor)
        if rc != OK:
            log.error("load_tensor_from_safetensor: storing %r failed with %d", store_key, rc)
            return None
        return tensor

    # ------------------------------------------------------------------ CUDA destinations
    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        return self.batch_get_tensor_into_cuda([key], [tensor])[0]

    def batch_get_tensor_into_cuda(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        op = "batch_get_tensor_into_cuda"
        keys = check_keys(keys, op)
        if not isinstance(tensors_list, (list, tuple)) or len(tensors_list) != len(keys):
            log.error("%s: %d keys but %s tensors", op, len(keys),
                      len(tensors_list) if isinstance(tensors_list, (list, tuple)) else "no list of")
            return [INVALID] * len(keys)
        out: list[int] = []
        for key, dst in zip(keys, tensors_list):
            if not getattr(dst, "is_cuda", False):
                where = getattr(dst, "device", type(dst).__name__)
                log.error("%s: destination for %r is on %s, not a CUDA tensor (this path writes into GPU "
                          "memory; on a host without a GPU use get_tensor_into / get_tensor)", op, key, where)
                out.append(INVALID)
                continue
            src = self.tensors.get_tensor(key)
            if src is None:
                out.append(NOT_FOUND)
                continue
            if src.dtype != dst.dtype or src.numel() != dst.numel() or not dst.is_contiguous():
                log.error("%s: %r holds %s%s, the destination is %s%s%s", op, key, src.dtype, tuple(src.shape),
                          dst.dtype, tuple(dst.shape), "" if dst.is_contiguous() else " (not contiguous)")
                out.append(INVALID)
                continue
            dst.view(-1).copy_(src.view(-1))  # host -> device (the copy engine)
            out.append(src.numel() * src.element_size())
        return out
