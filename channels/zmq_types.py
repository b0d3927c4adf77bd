"""The pyzmq types the planes use: synchronous sockets, whose receives give bytes."""

from __future__ import annotations

from typing import TypeAlias

import zmq

ZmqSocket: TypeAlias = "zmq.Socket[bytes]"
ZmqContext: TypeAlias = "zmq.Context[zmq.Socket[bytes]]"
