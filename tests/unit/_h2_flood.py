"""A hostile HTTP/2 peer for ``test_etcd_hostile.py``, run as a process of its own (its
flood must not share the test's event loop or its GIL). It accepts connections and never
reads a byte from them; on each it sends its SETTINGS, then

* ``ping``, ``settings``: PING or SETTINGS frames as fast as the socket takes them;
* ``sink``: nothing more (but windows as large as they go, so that only its not reading
  holds our writes back);
* ``trickle``: as ``sink``, and a PING every millisecond.

It prints its port, then runs until it is killed::

    python _h2_flood.py ping|settings|sink|trickle
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

SETTINGS = struct.pack(">I", 0)[1:] + bytes((4, 0)) + struct.pack(">I", 0)
PING = struct.pack(">I", 8)[1:] + bytes((6, 0)) + struct.pack(">I", 0) + b"flooding"
#: SETTINGS_INITIAL_WINDOW_SIZE as large as it goes, and the connection's window too.
OPEN = (
    struct.pack(">I", 6)[1:]
    + bytes((4, 0))
    + struct.pack(">IHI", 0, 4, 2**31 - 1)
    + struct.pack(">I", 4)[1:]
    + bytes((8, 0))
    + struct.pack(">II", 0, 2**31 - 1 - 65_535)
)


def flood(conn: socket.socket, frame: bytes) -> None:
    batch = frame * 4096
    try:
        conn.sendall(SETTINGS)
        while True:
            conn.sendall(batch)
    except OSError:
        pass  # the client dropped the connection
    finally:
        conn.close()


def sink(conn: socket.socket, trickle: bool) -> None:
    try:
        conn.sendall(OPEN)
        while trickle:
            conn.sendall(PING)
            time.sleep(0.001)
        threading.Event().wait()
    except OSError:
        pass
    finally:
        conn.close()


def main() -> None:
    mode = sys.argv[1]
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        if mode in ("sink", "trickle"):
            thread = threading.Thread(target=sink, args=(conn, mode == "trickle"), daemon=True)
        else:
            frame = PING if mode == "ping" else SETTINGS
            thread = threading.Thread(target=flood, args=(conn, frame), daemon=True)
        thread.start()


if __name__ == "__main__":
    main()
