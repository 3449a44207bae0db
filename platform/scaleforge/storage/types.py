"""The one type every storage function takes."""

import os
from typing import Union

Location = Union[str, os.PathLike]
"""A local path (``~`` allowed) or a URI (``s3://bucket/key?endpoint_override=...``)."""
