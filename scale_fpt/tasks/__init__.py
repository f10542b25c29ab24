"""The tasks, built by name (``build_task(config, seed)``); ``task_registry.TASKS`` lists them.

The public names load their modules on first use, so that the config layer reads the
registry without torch, and the image tasks pull in ``datasets`` only when they load data.
"""

from scale_fpt.lazy import lazy_exports

_BASE = ("Batch", "DataUnavailable", "Task", "TaskSpec", "epoch_indices",
         "release_device_draws", "split_batch", "step_draws")  # fmt: skip
_EXPORTS = {
    **dict.fromkeys(("build_task", "task_class", "task_spec"), "build"),
    **dict.fromkeys(_BASE, "base"),
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
