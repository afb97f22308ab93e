"""Evidence collectors, one module per layer, all behind one small protocol.

`COLLECTORS` maps a spec's collector names to their implementations; the spec validates
against it. It is empty until the first collector lands (issue 3: activity sampling).
"""

from __future__ import annotations

from typing import Any

COLLECTORS: dict[str, Any] = {}
