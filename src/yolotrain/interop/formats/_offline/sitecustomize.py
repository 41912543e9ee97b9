"""Loaded by Python at start-up in the TF.js converter's process (:mod:`..tfjs` puts this folder alone on its
``PYTHONPATH``): network connections are refused there, so an export never downloads anything."""

import socket


def _refuse_network(*args: object, **kwargs: object) -> None:
    raise OSError("network access is refused while converting to TF.js")


socket.socket.connect = _refuse_network  # type: ignore[method-assign]
socket.socket.connect_ex = _refuse_network  # type: ignore[method-assign]
socket.create_connection = _refuse_network  # type: ignore[assignment]
socket.getaddrinfo = _refuse_network  # type: ignore[assignment]
