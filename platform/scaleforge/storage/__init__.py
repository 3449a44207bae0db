"""Where files live: a local folder, or any URI that ``pyarrow.fs`` opens (``s3://``, ``gs://``, ...).

Every path a config names (artifacts, runs, checkpoints, records, reports) may be a URI, so that the
nodes of a cluster that share no disk all see the same files. URIs go through
``pyarrow.fs.FileSystem.from_uri``, the layer Ray Train itself uses for ``storage_path``, query
included (``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http``); ``s3://`` reads its
credentials from the usual AWS variables. A URI is never taken as a local path: a scheme this build
cannot open is a :class:`StorageError` naming it.

Every file a job writes for another process to read goes through :func:`write_atomic`. On a local
disk the bytes land in a temporary file in the same folder that is then renamed over the target
(``os.replace`` is atomic on POSIX); on an object store an object appears whole when its upload
completes, and not at all when the writer dies first. Either way a reader sees the old file or the
new one, never half of one.
"""

from scaleforge.storage.files import (
    delete_file,
    download,
    file_sizes,
    is_dir,
    is_file,
    node_cache,
    read_bytes,
    read_text,
    sha256_file,
    upload,
    write_atomic,
)
from scaleforge.storage.locations import (
    StorageError,
    check_fields,
    check_reachable,
    describe,
    is_uri,
    join,
    local_path,
    normalize,
    resolve,
    with_suffix,
)
from scaleforge.storage.types import Location

__all__ = [
    "Location",
    "StorageError",
    "check_fields",
    "check_reachable",
    "delete_file",
    "describe",
    "download",
    "file_sizes",
    "is_dir",
    "is_file",
    "node_cache",
    "is_uri",
    "join",
    "local_path",
    "normalize",
    "read_bytes",
    "read_text",
    "resolve",
    "sha256_file",
    "upload",
    "with_suffix",
    "write_atomic",
]
