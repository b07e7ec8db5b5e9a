"""pyarrow, loaded with the memory pool guardctl reads Parquet with.

Arrow's readers allocate from the pool pyarrow chose as it was loaded
(``ARROW_DEFAULT_MEMORY_POOL``). Its default, mimalloc, keeps the buffers of the segments
read earlier in a pass; jemalloc gives them back as the pass goes on: a cold pass over
closed segments peaks at about 0.6 times the memory (docs/performance.md, "A cold pass in a
store written for an hour"). So guardctl asks for jemalloc on Linux, where pyarrow's builds
have it, unless a pool was chosen or pyarrow was loaded before (then it is left as it is);
the variable is not left behind for the processes guardctl starts.
"""

from __future__ import annotations

import os
import sys

POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"

_CHOOSE = POOL_ENV not in os.environ and "pyarrow" not in sys.modules and sys.platform == "linux"
if _CHOOSE:
    os.environ[POOL_ENV] = "jemalloc"
try:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
finally:
    if _CHOOSE:
        del os.environ[POOL_ENV]

__all__ = ["POOL_ENV", "pa", "pc", "pq"]
