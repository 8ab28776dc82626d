"""Pool management methods of the store client: copy/move tasks, replica clearing.

``PoolApi`` is a delegate of ``MooncakeDistributedStore`` (the original's names, argument
order and return conventions; typed against ``StoreInternals``):

* ``create_copy_task(key, targets)`` / ``create_move_task(key, source, target)`` ->
  ``(task_id, code)``: the master plans the task and the client holding the source replica
  carries it out (``master_tasks``, ``replica_tasks``); ``query_task(task_id)`` ->
  ``(QueryTaskResponse | None, code)``. Codes: -704 missing key, -600 unknown segment or task.
* ``batch_replica_clear(keys, segment_name="")``: the keys whose replicas on that segment
  (all of them when "") were dropped; leased keys are skipped.
"""

from __future__ import annotations

from typing import Any

from mooncake_core.errors import MooncakeError
from mooncake_core.store.internals import StoreInternals
from mooncake_core.store.types import QueryTaskResponse
from mooncake_core.store.validate import check_key, check_keys
from mooncake_core.utils.log import get_logger

__all__ = ["PoolApi"]

log = get_logger("mooncake.store.pool_api")

NO_TASK = (0, 0)


def _segment_list(targets: Any, op: str) -> list[str]:
    if isinstance(targets, str) or not isinstance(targets, (list, tuple)) \
            or not all(isinstance(t, str) for t in targets):
        raise TypeError(f"{op}: targets must be a list of segment names (str)")
    return list(targets)


class PoolApi:
    def __init__(self, core: StoreInternals) -> None:
        self.core = core

    # ------------------------------------------------------------------ copy / move tasks
    def _task(self, op: str, key: str, fn: Any) -> tuple[tuple[int, int], int]:
        try:
            self.core.require_ready(op)
            return tuple(fn()), 0  # type: ignore[return-value]
        except MooncakeError as e:
            log.error("%s %r failed: %s", op, key, e)
            return NO_TASK, e.code

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        key = check_key(key, "create_copy_task")
        segs = _segment_list(targets, "create_copy_task")
        return self._task("create_copy_task", key,
                          lambda: self.core.master.create_copy_task(self.core.client_id, key, segs))

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        key = check_key(key, "create_move_task")
        if not isinstance(source, str) or not isinstance(target, str):
            raise TypeError("create_move_task: source and target must be segment names (str)")
        return self._task("create_move_task", key,
                          lambda: self.core.master.create_move_task(self.core.client_id, key, source, target))

    def query_task(self, task_id: Any) -> tuple[QueryTaskResponse | None, int]:
        if not isinstance(task_id, (tuple, list)) or len(task_id) != 2 \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in task_id):
            raise TypeError(f"query_task: task_id must be the (int, int) pair create_*_task returned, got {task_id!r}")
        try:
            self.core.require_ready("query_task")
            info = self.core.master.query_task((int(task_id[0]), int(task_id[1])))
        except MooncakeError as e:
            log.error("query_task %s failed: %s", tuple(task_id), e)
            return None, e.code
        return QueryTaskResponse(info.task_id, info.type, info.status, info.created_at_ms_epoch,
                                 info.last_updated_at_ms_epoch, info.assigned_client, info.message), 0

    # ------------------------------------------------------------------ replica clearing
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        keys = check_keys(keys, "batch_replica_clear")
        if not isinstance(segment_name, str):
            raise TypeError(f"batch_replica_clear: segment_name must be str, got {type(segment_name).__name__}")
        if not keys:
            return []
        try:
            self.core.require_ready("batch_replica_clear")
            cleared = list(self.core.master.batch_replica_clear(keys, segment_name))
        except MooncakeError as e:
            log.warning("batch_replica_clear: %s", e)
            return []
        if not segment_name or segment_name == self.core.segment_name:
            self.core.forget(cleared)
        return cleared
