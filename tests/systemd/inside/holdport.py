"""Hold a TCP port of the loopback open (`python3 holdport.py PORT`): the daemon's status port, taken."""

from __future__ import annotations

import signal
import socket
import sys

sock = socket.socket()
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
signal.pause()
