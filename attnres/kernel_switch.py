"""The on/off switch of a family of fused kernels (the CPU C kernels, the Triton kernels), read at every call.

An environment variable sets the default ("0", "off", "false" or "no" switch the family off); a
``with switch.use(enabled):`` block overrides it, the innermost block winning. Pure Python: no torch import.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

OFF_VALUES = frozenset({"0", "off", "false", "no"})


class KernelSwitch:
    """Whether one kernel family may run: the environment variable ``env``, overridden by ``use()`` blocks."""

    def __init__(self, env: str) -> None:
        self.env = env
        self._forced: list[bool] = []  # the use() blocks entered and not yet left, innermost last

    def forced(self) -> bool | None:
        """The innermost use() block's setting, or None outside every block."""
        return self._forced[-1] if self._forced else None

    def off(self) -> bool:
        """True when the kernels must not run: switched off by the innermost use() block or, outside every block,
        by the environment."""
        if self._forced:
            return not self._forced[-1]
        return os.environ.get(self.env, "1").strip().lower() in OFF_VALUES

    def off_reason(self) -> str:
        """Why off() is True, as the kernels' status() reports it."""
        if self._forced:
            return "off (use_kernels(False))"
        return f"off ({self.env}={os.environ.get(self.env)})"

    @contextlib.contextmanager
    def use(self, enabled: bool | None) -> Iterator[None]:
        """Within this block the kernels run where they apply (True) or never (False), whatever the environment
        says; None changes nothing."""
        if enabled is None:
            yield
            return
        self._forced.append(enabled)
        try:
            yield
        finally:
            self._forced.pop()
