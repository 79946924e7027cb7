"""The emulator as a command (`python -m jaxemb.testing.gcs BUCKET...`, docs/cloud.md): its buckets, the exports
that point another shell at it, and Ctrl-C stopping it."""

import json
import signal
import subprocess
import sys
import urllib.request

import pytest


def test_the_command_serves_its_buckets_prints_the_exports_and_stops_on_ctrl_c():
  command = subprocess.Popen(
    [sys.executable, "-m", "jaxemb.testing.gcs", "my-bucket", "other"], stdout=subprocess.PIPE, text=True
  )
  try:
    lines = [command.stdout.readline() for _ in range(4)]
    exports = dict(line.removeprefix("export ").strip().split("=", 1) for line in lines[:3])
    url = exports["STORAGE_EMULATOR_HOST"]
    assert exports == {
      "STORAGE_EMULATOR_HOST": url,
      "TENSORSTORE_GCS_HTTP_URL": url,
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }
    assert lines[3] == "# buckets: gs://my-bucket gs://other; Ctrl-C stops the emulator\n"
    listed = json.loads(urllib.request.urlopen(f"{url}/storage/v1/b", timeout=10).read())
    assert sorted(bucket["name"] for bucket in listed["items"]) == ["my-bucket", "other"]
    command.send_signal(signal.SIGINT)
    assert command.wait(timeout=30) == 0
    with pytest.raises(OSError):  # The server went with it.
      urllib.request.urlopen(f"{url}/storage/v1/b", timeout=5)
  finally:
    command.kill()
    command.wait()
