"""The error every design raises for a kernel step it cannot express on the array."""
from __future__ import annotations

from sdk.errors import SdkError


class DesignError(SdkError):
    """A kernel step that a design cannot express on the array (names the kernel and the reason)."""
