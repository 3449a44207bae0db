"""An S3-compatible server on 127.0.0.1 for tests and benchmarks: moto's standalone server.

    with LocalS3() as s3:
        uri = s3.uri("artifacts/teacher")   # s3://scaleforge-test/artifacts/teacher?endpoint_override=...

A real S3 API over HTTP in a process of its own (``python -m moto.server``, from the ``test`` extra),
with one bucket, reached through ``pyarrow``'s S3 filesystem exactly as a cloud bucket is. Its
clients need AWS credentials in the environment (any values: :meth:`LocalS3.credentials`); set them
before a Ray cluster starts, so that its workers inherit them as the nodes of a cloud cluster get theirs.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "scaleforge-test",
    "AWS_SECRET_ACCESS_KEY": "scaleforge-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""What the server accepts (any keys), and no lookup of an EC2 instance's metadata."""


class LocalS3:
    """moto's S3 server on a free port of 127.0.0.1 with ``bucket`` created; a context manager."""

    def __init__(self, bucket: str = "scaleforge-test"):
        self.bucket = bucket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self._process: Optional[subprocess.Popen] = None
        self._log = None

    @staticmethod
    def credentials() -> None:
        """Set the AWS variables this server's clients need, unless they are set already."""
        for name, value in CREDENTIALS.items():
            os.environ.setdefault(name, value)

    def uri(self, key: str, bucket: Optional[str] = None) -> str:
        """``s3://<bucket>/<key>?endpoint_override=...&scheme=http``: what a user writes for this server."""
        return f"s3://{bucket or self.bucket}/{key.strip('/')}?endpoint_override={self.endpoint}&scheme=http"

    def start(self, timeout_s: float = 60) -> "LocalS3":
        import pyarrow.fs

        self.credentials()
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError as err:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the S3 server on {self.endpoint} did not start (is moto[server] installed?)"
                    ) from err
                time.sleep(0.1)
        pyarrow.fs.S3FileSystem(
            endpoint_override=self.endpoint, scheme="http", allow_bucket_creation=True
        ).create_dir(self.bucket)
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=30)
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
